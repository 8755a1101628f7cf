// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package procstat

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

// TestParse: the command field may hold spaces and parentheses.
func TestParse(t *testing.T) {
	t.Parallel()
	state, start, err := Parse([]byte("4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 100 18446744073709551615\n"))
	if err != nil || state != 'S' || start != 987654 {
		t.Errorf("Parse = %c, %d, %v; want S, 987654", state, start, err)
	}
	for _, bad := range []string{"4242 (x) S 1", "4242 x S", "4242 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) took it", bad)
		}
	}
}

// TestStartTime: this process has one; a child that exited and was
// reaped has none.
func TestStartTime(t *testing.T) {
	t.Parallel()
	if s, err := StartTime(os.Getpid()); err != nil || s == 0 {
		t.Errorf("StartTime(self) = %d, %v", s, err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := StartTime(cmd.Process.Pid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("StartTime of a reaped child: %v", err)
	}
}
