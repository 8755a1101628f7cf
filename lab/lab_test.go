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
		"gpu.hwdra.io: 168 devices",
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
			`unknown field "spec.devices.requets"`},
		"wrong type": {[]string{write("type.yaml", claimYAML("t", "exactly: {deviceClassName: gpu.hwdra.io, count: many}"))},
			`spec.devices.requests[0].exactly.count: Invalid value: "many": must be an integer`},
		"does not fit": {[]string{write("many.yaml", claimYAML("many", "exactly: {deviceClassName: gpu.hwdra.io, count: 9}"))},
			"claim many cannot be allocated on this node:\n    request gpu: 9 device(s) of class gpu.hwdra.io requested, 8 match"},
		"no device of the class": {[]string{write("vgpu.yaml", claimYAML("v", "exactly: {deviceClassName: vgpu.gpu.hwdra.io}"))},
			"request gpu: 1 device(s) of class vgpu.gpu.hwdra.io requested, 0 match"},
		"fit alone, not together": {[]string{write("a.yaml", claimYAML("a", "exactly: {deviceClassName: gpu.hwdra.io, count: 5}")),
			write("b.yaml", claimYAML("b", "exactly: {deviceClassName: gpu.hwdra.io, count: 4}"))},
			"each claim fits alone, but not all together: a, b"},
		"negative count": {[]string{write("neg.yaml", claimYAML("neg", "exactly: {deviceClassName: gpu.hwdra.io, count: -1}"))},
			"ResourceClaim \"neg\" is invalid:\n  spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"},
		"bad selector": {[]string{write("cel.yaml", claimYAML("cel", "exactly: {deviceClassName: gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes['}}]}"))},
			"spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value"},
		"both kinds of request": {[]string{write("both.yaml", claimYAML("both", "exactly: {deviceClassName: gpu.hwdra.io}\n      firstAvailable: [{name: a, deviceClassName: gpu.hwdra.io}]"))},
			"exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"},
		"constraint on no request": {[]string{write("cons.yaml", claimYAML("cons", "exactly: {deviceClassName: gpu.hwdra.io}")+
			"    constraints: [{requests: [other], matchAttribute: resource.kubernetes.io/numaNode}]\n")},
			`spec.devices.constraints[0].requests[0]: Invalid value: "other": must be the name of a request`},
		"empty directory": {[]string{t.TempDir()}, "no .yaml, .yml or .json file in the directory"},
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

// claimYAML is a claim with one request named gpu.
func claimYAML(name, request string) string {
	return "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: " + name +
		"}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      " + request + "\n"
}

// TestLabTakesFilesAndDirectories: several files and directories, as
// kubectl -f takes them; a count of 0 is what the API server makes it, 1.
func TestLabTakesFilesAndDirectories(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "zero.yaml"), []byte(claimYAML("zero", "exactly: {deviceClassName: gpu.hwdra.io, count: 0}")), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a manifest"), 0o644)
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100",
		ClaimFiles: append(examples("gpu-full.yaml", "mig-1g.10gb.yaml"), dir)})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"gpu-full: unprepared", "mig-1g-10gb: unprepared", "zero: unprepared"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Count(out.String(), "- device: gpu-") < 3 {
		t.Errorf("claim zero did not get one device:\n%s", out.String())
	}
}
