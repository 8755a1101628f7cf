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

// FuzzExpand: a directory of files of any names (a name ending in "/" is
// a subdirectory) expands to exactly its .yaml, .yml and .json files, in
// name order, and to an error where there are none; standard input is
// taken once.
func FuzzExpand(f *testing.F) {
	f.Add("a.yaml\nb.yml\nc.json\nd.txt\nsub/\n.yaml\nx.YAML")
	f.Add("only.txt")
	f.Add("z.json\na.json\nm.yaml/")
	f.Fuzz(func(t *testing.T, names string) {
		dir := t.TempDir()
		var want []string
		for _, n := range strings.Split(names, "\n") {
			sub := strings.HasSuffix(n, "/")
			n = strings.TrimSuffix(n, "/")
			if n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") || len(n) > 200 {
				continue
			}
			p := filepath.Join(dir, n)
			if _, err := os.Lstat(p); err == nil {
				continue // named twice
			}
			if sub {
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if ext := filepath.Ext(n); ext == ".yaml" || ext == ".yml" || ext == ".json" {
				want = append(want, p)
			}
		}
		slices.Sort(want)
		got, err := Expand([]string{dir, Stdin})
		if len(want) == 0 {
			if err == nil {
				t.Fatalf("no manifest in %v, yet %v", names, got)
			}
			return
		}
		if err != nil || !slices.Equal(got, append(want, Stdin)) {
			t.Fatalf("Expand = %v, %v; want %v and stdin", got, err, want)
		}
		if _, err := Expand([]string{Stdin, dir, Stdin}); err == nil {
			t.Fatal("standard input taken twice")
		}
	})
}
