// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package manifestfiles

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestExpand: a directory gives its manifest files in name order, not its
// subdirectories' or other files; stdin once; an empty directory and a
// missing path are errors.
func TestExpand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"b.yaml", "a.json", "c.yml", "notes.txt", "sub/d.yaml"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Expand([]string{"-", dir, "x.yaml-as-given"})
	if err == nil || !strings.Contains(err.Error(), "x.yaml-as-given") {
		t.Errorf("a missing path: %v", err)
	}
	got, err := Expand([]string{Stdin, dir})
	want := []string{Stdin, filepath.Join(dir, "a.json"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yml")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Expand = %q, %v; want %q", got, err, want)
	}
	if _, err := Expand([]string{Stdin, Stdin}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("stdin twice: %v", err)
	}
	if _, err := Expand([]string{filepath.Join(dir, "sub", "..", "sub", "none-here"), t.TempDir()}); err == nil {
		t.Error("a missing path and an empty directory were taken")
	}
	if _, err := Expand([]string{t.TempDir()}); err == nil || !strings.Contains(err.Error(), "no .yaml, .yml or .json file") {
		t.Errorf("an empty directory: %v", err)
	}
}
