// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package layout

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a production function may be: longer ones
// read better as named steps (internal/agent/serve.go's serve is the
// model).
const maxFuncLines = 80

// TestNoLongFunctions: no function of the production code (api, cmd,
// deploy, hack, internal; not tests, not generated code) is longer than
// maxFuncLines lines, its signature and closing brace included.
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	for _, root := range []string{"api", "cmd", "deploy", "hack", "internal"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(src, []byte("\n// Code generated ")) || bytes.HasPrefix(src, []byte("// Code generated ")) {
				return nil
			}
			f, err := parser.ParseFile(fset, path, src, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				checked++
				if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
					rel, _ := filepath.Rel("../..", path)
					t.Errorf("%s: %s is %d lines, over %d: split it into named steps", rel, fn.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 500 {
		t.Fatalf("only %d functions checked", checked)
	}
}
