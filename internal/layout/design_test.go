// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// designDoc is docs/design.md, the map these tests hold the code to.
func designDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableAfter is the rows of the Markdown table whose header line is
// header, each row's cells trimmed.
func tableAfter(t *testing.T, doc, header string) [][]string {
	t.Helper()
	i := strings.Index(doc, header+"\n")
	if i < 0 {
		t.Fatalf("docs/design.md has no table %q", header)
	}
	var rows [][]string
	for _, line := range strings.Split(doc[i:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), " | ") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	return rows
}

var backticked = regexp.MustCompile("`([^`]+)`")

// codeSpans is each `...` of s.
func codeSpans(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestImportsAsDesigned: every import from one of the module's folders to
// another is one design.md's "may import" table allows.
func TestImportsAsDesigned(t *testing.T) {
	allowed := map[string][]string{}
	for _, row := range tableAfter(t, designDoc(t), "| folder | may import |") {
		may := row[1]
		if i := strings.Index(may, " ("); i >= 0 {
			may = may[:i] // a row's note on a spelled-out exception
		}
		for _, from := range codeSpans(row[0]) {
			allowed[from] = codeSpans(may)
		}
	}
	if len(allowed) < 10 {
		t.Fatalf("design.md's import table has %d folders", len(allowed))
	}
	folder := func(pkg string) string {
		best := ""
		for f := range allowed {
			if (pkg == f || strings.HasPrefix(pkg, f+"/")) && len(f) > len(best) {
				best = f
			}
		}
		return best
	}
	for _, line := range goList(t, "", `{{.ImportPath}} {{join .Imports " "}}`, "./...") {
		f := strings.Fields(line)
		from := strings.TrimPrefix(f[0], module)
		fromFolder := folder(from)
		if fromFolder == "" {
			t.Errorf("package %s is in no folder of design.md's import table", from)
			continue
		}
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := strings.TrimPrefix(imp, module)
			toFolder := folder(to)
			switch {
			case toFolder == fromFolder, slices.Contains(allowed[fromFolder], toFolder):
			case toFolder == "internal/mock" && strings.HasSuffix(from, "test"):
				// Test helpers drive the simulator.
			case toFolder == "internal/mock" && from == "internal/backend":
				// The opener of mock: hardware (TestImageBuildHasNoSimulator
				// keeps it out of the image).
			default:
				t.Errorf("%s imports %s: design.md lets %s import only %v", from, to, fromFolder, allowed[fromFolder])
			}
		}
	}
}

// TestDesignNamesEveryPackage: design.md's package tables name every Go
// package of the module (as a row or in a row's text), and every row names
// a folder that exists.
func TestDesignNamesEveryPackage(t *testing.T) {
	doc := designDoc(t)
	var text strings.Builder
	for _, part := range strings.Split(doc, "| package | what it does |")[1:] {
		end := strings.Index(part, "\n\n")
		if end < 0 {
			end = len(part)
		}
		text.WriteString(part[:end])
		for _, line := range strings.Split(part[:end], "\n")[2:] {
			row := strings.SplitN(strings.Trim(line, "|"), " | ", 2)
			for _, dir := range codeSpans(row[0]) {
				if fi, err := os.Stat(filepath.Join("../..", dir)); err != nil || !fi.IsDir() {
					t.Errorf("design.md's package tables name %s, which is no folder", dir)
				}
			}
		}
	}
	named := codeSpans(text.String())
	for _, pkg := range goList(t, "", "{{.ImportPath}}", "./...") {
		p := strings.TrimPrefix(pkg, module)
		if !slices.Contains(named, p) {
			t.Errorf("design.md's package tables do not name %s", p)
		}
	}
}

// TestLoopTableAsInLoopGo: the runtime loop's interfaces are the same in
// internal/agent/loop.go's assertions (which the compiler checks), in its
// comment, and in design.md's table, with the same implementations.
func TestLoopTableAsInLoopGo(t *testing.T) {
	src, err := os.ReadFile("../agent/loop.go")
	if err != nil {
		t.Fatal(err)
	}
	asserted := loopAssertions(t, src)
	comment := map[string]string{} // interface -> "implementation: why"
	arrow := regexp.MustCompile(`^//\t(.+?)\s+-->\s+(\S+)\s+(.*)$`)
	for _, line := range strings.Split(string(src), "\n") {
		if m := arrow.FindStringSubmatch(line); m != nil {
			comment[m[2]] = m[1] + " | " + m[3]
		}
	}
	table := map[string]string{}
	for _, row := range tableAfter(t, designDoc(t), "| caller | interface | implemented by |") {
		impl := strings.Replace(row[2], "`", "", 2)
		table[strings.Trim(row[1], "`")] = strings.Trim(row[0], "`") + " | " + impl
	}
	if len(asserted) < 20 {
		t.Fatalf("loop.go asserts %d interfaces", len(asserted))
	}
	for iface, impls := range asserted {
		c, ok := comment[iface]
		if !ok {
			t.Errorf("loop.go asserts %s but its comment does not list it", iface)
			continue
		}
		for _, impl := range impls {
			if !strings.Contains(c, impl) {
				t.Errorf("loop.go's comment gives %s as %q, not naming %s", iface, c, impl)
			}
		}
		if table[iface] != c {
			t.Errorf("design.md's runtime loop table gives %s as %q, loop.go %q", iface, table[iface], c)
		}
	}
	for iface := range comment {
		if _, ok := asserted[iface]; !ok {
			t.Errorf("loop.go's comment lists %s, which it does not assert", iface)
		}
	}
	for iface := range table {
		if _, ok := asserted[iface]; !ok {
			t.Errorf("design.md's runtime loop table lists %s, which loop.go does not assert", iface)
		}
	}
}

// loopAssertions are loop.go's `_ pkg.Interface = impl` lines: interface
// to the last names of the types asserted to implement it.
func loopAssertions(t *testing.T, src []byte) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "loop.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if len(v.Names) != 1 || v.Names[0].Name != "_" || len(v.Values) != 1 {
				continue
			}
			iface := typeName(v.Type, true)
			out[iface] = append(out[iface], typeName(v.Values[0], false))
		}
	}
	return out
}

// typeName is the name in a type or value expression: pkg.Name (qualified)
// or Name.
func typeName(e ast.Expr, qualified bool) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok && qualified {
			return id.Name + "." + x.Sel.Name
		}
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr:
		return typeName(x.X, qualified)
	case *ast.StarExpr:
		return typeName(x.X, qualified)
	case *ast.ParenExpr:
		return typeName(x.X, qualified)
	case *ast.CallExpr:
		return typeName(x.Fun, qualified)
	case *ast.CompositeLit:
		return typeName(x.Type, qualified)
	}
	return ""
}
