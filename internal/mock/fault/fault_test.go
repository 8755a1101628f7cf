// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInbox: a fault reaches the process serving the directory, which
// answers with its error; nothing is left in the inbox; once it stops
// serving, an injection times out and takes its request back.
func TestInbox(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var got []Fault
	in, err := Serve(dir, func(f Fault) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, f)
		if f.Kind == "melt" {
			return errors.New("unknown fault")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gi := 3
	sent := Fault{Kind: XID, GPU: "0000:1b:00.0", XID: 94, GPUInstance: &gi}
	if err := InjectDir(ctx, dir, sent); err != nil {
		t.Fatal(err)
	}
	if err := InjectDir(ctx, dir, Fault{Kind: "melt"}); err == nil || !strings.Contains(err.Error(), "unknown fault") {
		t.Errorf("refused fault: %v", err)
	}
	mu.Lock()
	if len(got) != 2 || got[0].Kind != XID || got[0].XID != 94 || got[0].GPUInstance == nil || *got[0].GPUInstance != 3 {
		t.Errorf("applied %+v, want %+v first", got, sent)
	}
	mu.Unlock()
	if left, _ := os.ReadDir(filepath.Join(dir, InboxDir)); len(left) != 0 {
		t.Errorf("left in the inbox: %v", left)
	}

	in.Close()
	short, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if err := InjectDir(short, dir, Fault{Kind: Link, PF: "pfa"}); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("nobody serving: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, InboxDir)); len(left) != 0 {
		t.Errorf("an unanswered request stayed: %v", left)
	}
	if err := InjectDir(ctx, t.TempDir(), sent); err == nil || !strings.Contains(err.Error(), "no mock hardware directory") {
		t.Errorf("a directory without mock hardware: %v", err)
	}
}
