package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func examples(names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, filepath.Join("..", "deploy", "examples", n))
	}
	return out
}

func TestLabRunsTheExamples(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{
		Hardware:   "mock:dgx-h100",
		ClaimFiles: examples("mig-1g.10gb.yaml", "gpu-full.yaml", "first-available.yaml"),
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"gpu.hwdra.io: 208 devices",
		"== Allocation (the scheduler's allocator) ==",
		"request: gpu/small", // first-available picked its first subrequest
		"gpu.hwdra.io/claim=lab-default-mig-1g-10gb-",
		"NVIDIA_VISIBLE_DEVICES=void",
		"/dev/nvidiactl",
		"gpu.hwdra.io/profile:\n      string: 1g.10gb",
		"MIG on, 2 GPU instance(s) [1g.10gb at slice 5] [1g.10gb at slice 6]",
		"mig-1g-10gb: unprepared",
		"no GPU instances or MIG modes differ from the start",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(got)
	}
}

func TestLabBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o644)
		return p
	}
	cases := map[string]struct {
		files []string
		want  string
	}{
		"no claims":    {nil, "no --claim given"},
		"missing file": {[]string{filepath.Join(dir, "nope.yaml")}, "no such file"},
		"wrong kind":   {[]string{write("pod.yaml", "apiVersion: resource.k8s.io/v1\nkind: Pod\nmetadata: {name: x}\n")}, `kind "Pod"`},
		"unknown field": {[]string{write("typo.yaml", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: x}\nspec: {devices: {requets: []}}\n")},
			`unknown field "requets"`},
		"does not fit": {[]string{write("many.yaml", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: x}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.hwdra.io, count: 9}\n")},
			"claims cannot be allocated"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := Run(context.Background(), &bytes.Buffer{}, Options{Hardware: "mock:dgx-h100", ClaimFiles: tc.files})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}
