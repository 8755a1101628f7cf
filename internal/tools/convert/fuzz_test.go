// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/cel"
)

// celSeeds are TestRewriteCEL's expressions and every CEL expression of
// the testdata manifests.
func celSeeds(tb testing.TB) []string {
	tb.Helper()
	out := []string{
		`device.driver == "gpu.example.com"`,
		`device.driver != 'gpu.nvidia.com'`,
		`device.attributes["gpu.nvidia.com"].numa == 1`,
		`"uuid" in device.attributes["gpu.nvidia.com"]`,
		`device.attributes["gpu.nvidia.com"]["type"] == "vfio"`,
		`device.capacity["gpu.nvidia.com"].multiprocessors > 60`,
		`device.capacity["gpu.nvidia.com"].memorySlice3 == 1`,
		`device.attributes["gpu.nvidia.com"].minor == 0`,
		`size(device.attributes["gpu.nvidia.com"]) > 0`,
		`device.driver == "compute-domain.nvidia.com"`,
		`has(device.attributes["gpu.nvidia.com"].architecture) && device.attributes["gpu.nvidia.com"].architecture == "Hopper"`,
		`device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100") || [1, 2].exists(x, x == device.attributes["gpu.nvidia.com"].index)`,
	}
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var doc any
			if err := dec.Decode(&doc); err == io.EOF {
				break
			} else if err != nil {
				tb.Fatalf("%s: %v", file, err)
			}
			out = append(out, expressions(doc)...)
		}
	}
	return out
}

func expressions(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expression" {
				out = append(out, s)
			}
			out = append(out, expressions(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, expressions(x)...)
		}
	}
	return out
}

var celCompiler = cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})

// FuzzRewriteCEL: whatever selector a manifest holds, the rewrite never
// panics, and:
//   - an expression naming no NVIDIA domain comes back byte for byte, an
//     unparsable one too, with a problem that says so;
//   - a rewritten expression parses, and a second rewrite leaves it as
//     it is (the first finished the job);
//   - without problems, no NVIDIA driver name is left in it;
//   - a selector the scheduler compiles still compiles rewritten.
func FuzzRewriteCEL(f *testing.F) {
	for _, s := range celSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		out, whys := rewriteCEL(expr)
		if !strings.Contains(expr, nvidiaDomainSuffix) {
			if out != expr || len(whys) > 0 {
				t.Fatalf("%q names no NVIDIA domain but came back %q, %q", expr, out, whys)
			}
			return
		}
		if _, errs := celParser.Parse(common.NewTextSource(expr)); errs != nil && len(errs.GetErrors()) > 0 {
			if out != expr || len(whys) == 0 {
				t.Fatalf("unparsable %q came back %q, %q", expr, out, whys)
			}
			return
		}
		if out != expr {
			reparsed, errs := celParser.Parse(common.NewTextSource(out))
			if errs != nil && len(errs.GetErrors()) > 0 {
				t.Fatalf("%q rewritten to %q, which does not parse: %v", expr, out, errs.ToDisplayString())
			}
			if len(whys) == 0 {
				ast.PreOrderVisit(reparsed.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
					if s, ok := stringLit(e); ok && (s == nvidiaDriver || s == nvidiaCDDriver) {
						t.Fatalf("%q rewritten without problems to %q, which still names %s", expr, out, s)
					}
				}))
			}
			if again, _ := rewriteCEL(out); again != out {
				t.Fatalf("%q rewritten to %q, and again to %q", expr, out, again)
			}
		}
		if celCompiler.CompileCELExpression(expr, cel.Options{}).Error == nil {
			if res := celCompiler.CompileCELExpression(out, cel.Options{}); res.Error != nil {
				t.Fatalf("%q compiles, its rewrite %q does not: %v", expr, out, res.Error)
			}
		}
	})
}

// FuzzConvert: whatever manifests it is given, hwdra convert never
// panics, and what it writes is YAML documents it reads again.
func FuzzConvert(f *testing.F) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Convert([]Input{{Name: "in.yaml", Data: data}})
		if err != nil {
			return
		}
		if _, err := Convert([]Input{{Name: "out.yaml", Data: res.Output}}); err != nil {
			t.Fatalf("the output does not read again: %v\n%s", err, res.Output)
		}
	})
}
