// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func examples(names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, filepath.Join("..", "..", "..", "deploy", "examples", n))
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
	wantOutput(t, got,
		"gpu.hwdra.io: 176 devices",
		"== Allocation (the scheduler's allocator) ==",
		"request: gpu/small", // first-available picked its first subrequest
		"gpu.hwdra.io/claim=lab-default-mig-1g-10gb-",
		"NVIDIA_VISIBLE_DEVICES=void",
		"/dev/nvidiactl",
		"gpu.hwdra.io/profile:\n      string: 1g.10gb",
		"MIG on, 2 GPU instance(s) [1g.10gb at slice 5] [1g.10gb at slice 6]",
		"mig-1g-10gb: unprepared",
		"no GPU instances or MIG modes differ from the start",
	)
	if t.Failed() {
		t.Log(got)
	}
}

// TestLabGPUsForVMs: on a node of a current vGPU driver with a GPU bound
// to vfio-pci, a vGPU claim gets a VF of the VFIO framework and a
// passthrough claim the GPU's VFIO group.
func TestLabGPUsForVMs(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{
		Hardware:   "mock:h100-vm",
		ClaimFiles: examples("vgpu.yaml", "passthrough.yaml"),
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	wantOutput(t, got,
		"HWDRA_GPU_0000_52_00_0_PASSTHROUGH_PCI=0000:52:00.0",
		"gpu.hwdra.io/parentPciBusID",
		"/dev/vfio/vfio",
		"passthrough: unprepared",
	)
	if t.Failed() {
		t.Log(got)
	}

	// A node of GPUs bound to vfio-pci only: no NVIDIA driver, no NVML.
	spec := filepath.Join(t.TempDir(), "vfio-only.yaml")
	if err := os.WriteFile(spec, []byte("gpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Run(context.Background(), &out, Options{Hardware: "mock:" + spec, ClaimFiles: examples("passthrough.yaml")}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "HWDRA_GPU_0000_1B_00_0_PASSTHROUGH_PCI=0000:1b:00.0") {
		t.Errorf("vfio-pci GPUs only:\n%s", out.String())
	}
}

// TestLabRunsTheSharingExamples: a GPU share, a dedicated one beside it,
// a claim shared through MPS and one time-sliced, prepared for real on
// mock GPUs: the containers' MPS environment in their CDI specs, the
// daemons with their defaults, and everything undone.
func TestLabRunsTheSharingExamples(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{
		Hardware:   "mock:dgx-h100",
		ClaimFiles: examples("gpu-share.yaml", "gpu-share-dedicated.yaml", "gpu-mps.yaml", "gpu-timeslicing.yaml"),
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	wantOutput(t, got,
		"device: gpu-0000-1b-00-0-share",
		"MPS control daemon ",
		"for the GPU's policed shares: devices GPU-",
		"for the dedicated share of claim lab-default-gpu-share-dedicated: devices GPU-",
		"defaults set_default_active_thread_percentage 30, set_default_device_pinned_mem_limit 0 10240M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
		"gpu-share-dedicated: unprepared",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M",
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
		"gpu-share: unprepared", "gpu-mps: unprepared", "gpu-timeslicing: unprepared",
		"no MPS control daemons",
	)
	if t.Failed() {
		t.Log(got)
	}
}

// wantOutput fails t for each of wants the lab's output lacks.
func wantOutput(t testing.TB, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestLabBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o644)
		return p
	}
	bad := badDir(t)
	cases := map[string]struct {
		files []string
		want  string
	}{
		"no claims":    {nil, "no --claim given"},
		"missing file": {[]string{filepath.Join(dir, "nope.yaml")}, "no such file"},
		"wrong kind":   {[]string{write("pod.yaml", "apiVersion: resource.k8s.io/v1\nkind: Pod\nmetadata: {name: x}\n")}, "pod.yaml, document 1: Pod x: no kind Pod in resource.k8s.io/v1"},
		"unknown field": {[]string{write("typo.yaml", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: x}\nspec: {devices: {requets: []}}\n")},
			`unknown field "spec.devices.requets"`},
		"wrong type": {[]string{write("type.yaml", claimYAML("t", "exactly: {deviceClassName: gpu.hwdra.io, count: many}"))},
			`spec.devices.requests[0].exactly.count: Invalid value: "many": must be an integer`},
		"does not fit": {[]string{write("many.yaml", claimYAML("many", "exactly: {deviceClassName: gpu.hwdra.io, count: 9}"))},
			"claim many cannot be allocated on this node:\n        request gpu: 9 devices of class gpu.hwdra.io requested, 8 match"},
		"no device of the class": {[]string{write("vgpu.yaml", claimYAML("v", "exactly: {deviceClassName: vgpu.gpu.hwdra.io}"))},
			"request gpu: class vgpu.gpu.hwdra.io has no device on this node"},
		"no such class": {[]string{write("class.yaml", claimYAML("c", "exactly: {deviceClassName: tpu.example.com}"))},
			"request gpu: device class tpu.example.com does not exist (classes: dedicated-share.gpu.hwdra.io, gpu.hwdra.io, mig.gpu.hwdra.io, passthrough.gpu.hwdra.io, share.gpu.hwdra.io, vf-share.sriov.hwdra.io, vf.sriov.hwdra.io, vgpu.gpu.hwdra.io)"},
		"selectors exclude the class's devices": {[]string{write("sel.yaml", claimYAML("s",
			`exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "9g.90gb"'}}]}`))},
			"request gpu: the selectors exclude all 160 devices of class mig.gpu.hwdra.io (their gpu.hwdra.io/profile: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"},
		"more partitions than fit": {[]string{write("mig3.yaml", claimYAML("mig3",
			`exactly: {deviceClassName: mig.gpu.hwdra.io, count: 3, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile in ["3g.40gb", "4g.40gb"] && device.attributes["resource.kubernetes.io"].pciBusID == "0000:1b:00.0"'}}]}`))},
			"request gpu: 3 devices of class mig.gpu.hwdra.io requested, at most 2 of the 3 that match fit this node together: they use the same counters"},
		"a share larger than the PF": {[]string{write("big.yaml", claimYAML("big",
			"exactly: {deviceClassName: vf-share.sriov.hwdra.io, capacity: {requests: {sriov.hwdra.io/bandwidth: 1000G}}}"))},
			"request gpu: capacity sriov.hwdra.io/bandwidth: asks for 1T, but a matching device of class vf-share.sriov.hwdra.io gives at most 400G to one allocation"},
		//nolint:misspell // the claim's misspelled capacity name is the test
		"a misspelled capacity": {[]string{write("bandwdith.yaml", claimYAML("bandwdith",
			"exactly: {deviceClassName: vf-share.sriov.hwdra.io, capacity: {requests: {sriov.hwdra.io/bandwdith: 10G}}}"))},
			"request gpu: capacity sriov.hwdra.io/bandwdith: no matching device of class vf-share.sriov.hwdra.io has it (they have: sriov.hwdra.io/bandwidth, sriov.hwdra.io/vfs)"},
		"a partner request matches nothing": {[]string{write("pair.yaml", claimYAML("pair", "exactly: {deviceClassName: gpu.hwdra.io}\n"+
			`    - name: nic
      exactly: {deviceClassName: vf-share.sriov.hwdra.io, selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].numaNode == 7'}}]}
    constraints: [{requests: [gpu, nic], matchAttribute: resource.kubernetes.io/numaNode}]`))},
			"claim pair cannot be allocated on this node:\n        request gpu: fits alone (8 devices of class gpu.hwdra.io match)\n        request nic: the selectors exclude all 9 devices of class vf-share.sriov.hwdra.io"},
		"a constraint no devices meet": {[]string{write("numa.yaml", claimYAML("numa",
			`exactly: {deviceClassName: gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].numaNode == 0'}}]}
    - name: nic
      exactly: {deviceClassName: vf-share.sriov.hwdra.io, selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].numaNode == 1'}}]}
    constraints: [{requests: [gpu, nic], matchAttribute: resource.kubernetes.io/numaNode}]`))},
			"constraints[0] cannot be met: no devices matching requests gpu, nic share one value of resource.kubernetes.io/numaNode"},
		"matching devices that exclude each other": {[]string{write("me.yaml", claimYAML("me",
			`exactly: {deviceClassName: mig.gpu.hwdra.io, count: 2, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb+me" && device.attributes["resource.kubernetes.io"].pciBusID == "0000:1b:00.0"'}}]}`))},
			"request gpu: 2 devices of class mig.gpu.hwdra.io requested, at most 1 of the 2 that match fit this node together: they use the same counters"},
		"files that fit alone, not one after the other": {[]string{write("a.yaml", claimYAML("a", "exactly: {deviceClassName: gpu.hwdra.io, count: 5}")),
			write("b.yaml", claimYAML("b", "exactly: {deviceClassName: gpu.hwdra.io, count: 4}"))},
			"b.yaml:\n    the claims fit this node when nothing is allocated, but not beside the claims allocated before them:\n        claim b, request gpu:"},
		"claims of a file that fit alone, not together": {[]string{write("ab.yaml", claimYAML("a", "exactly: {deviceClassName: gpu.hwdra.io, count: 5}")+
			"---\n"+claimYAML("b", "exactly: {deviceClassName: gpu.hwdra.io, count: 4}"))},
			"each claim fits this node alone, but not all together (they need the same devices or counters): a, b"},
		"invalid name": {[]string{write("name.yaml", claimYAML("Bad_Name", "exactly: {deviceClassName: gpu.hwdra.io}"))},
			"ResourceClaim \"Bad_Name\" is invalid:\n  metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"},
		"invalid namespace": {[]string{write("ns.yaml", strings.Replace(claimYAML("x", "exactly: {deviceClassName: gpu.hwdra.io}"), "{name: x}", "{name: x, namespace: Bad_NS}", 1))},
			`metadata.namespace: Invalid value: "Bad_NS": a lowercase RFC 1123 label`},
		"invalid toleration": {[]string{write("tol.yaml", claimYAML("tol", `exactly: {deviceClassName: gpu.hwdra.io, tolerations: [{key: "a b", operator: Exists}]}`))},
			`spec.devices.requests[0].exactly.tolerations[0].key: Invalid value: "a b"`},
		"an empty file": {[]string{write("empty.yaml", "# nothing\n")}, "empty.yaml: no ResourceClaim, ResourceClaimTemplate or pod in it"},
		"negative count": {[]string{write("neg.yaml", claimYAML("neg", "exactly: {deviceClassName: gpu.hwdra.io, count: -1}"))},
			"ResourceClaim \"neg\" is invalid:\n  spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"},
		"bad selector": {[]string{write("cel.yaml", claimYAML("cel", "exactly: {deviceClassName: gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes['}}]}"))},
			"spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value"},
		"both kinds of request": {[]string{write("both.yaml", claimYAML("both", "exactly: {deviceClassName: gpu.hwdra.io}\n      firstAvailable: [{name: a, deviceClassName: gpu.hwdra.io}]"))},
			"exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"},
		"constraint on no request": {[]string{write("cons.yaml", claimYAML("cons", "exactly: {deviceClassName: gpu.hwdra.io}")+
			"    constraints: [{requests: [other], matchAttribute: resource.kubernetes.io/numaNode}]\n")},
			`spec.devices.constraints[0].requests[0]: Invalid value: "other": must be the name of a request`},
		"empty directory":               {[]string{t.TempDir()}, "no .yaml, .yml or .json file in the directory"},
		"every bad file of a directory": {[]string{bad}, "bad1.yaml, document 1: Pod x: no kind Pod in resource.k8s.io/v1\n" + bad + "/bad2.yaml, document 1: ResourceClaim z: unknown field \"spec.x\""},
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

// badDir is a directory of two bad files.
func badDir(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad1.yaml"), []byte("apiVersion: resource.k8s.io/v1\nkind: Pod\nmetadata: {name: x}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad2.yaml"), []byte("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: z}\nspec: {x: 1}\n"), 0o644)
	return dir
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
	wantOutput(t, out.String(), "gpu-full: unprepared", "mig-1g-10gb: unprepared", "zero: unprepared")
	if strings.Count(out.String(), "- device: gpu-") < 3 {
		t.Errorf("claim zero did not get one device:\n%s", out.String())
	}
}

// TestLabReadsStdin: --claim - reads standard input, as kubectl -f -.
func TestLabReadsStdin(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{"-"},
		Stdin: strings.NewReader(claimYAML("piped", "exactly: {deviceClassName: gpu.hwdra.io}"))})
	if err != nil || !strings.Contains(out.String(), "piped: unprepared") {
		t.Fatalf("%v\n%s", err, out.String())
	}
}

// TestLabExamplesDirectory: the user guide's "several at once" (the lab): every example
// that fits the profile is allocated, prepared and shown, each file beside
// the ones before it; the ones that do not fit are named with why, at the
// end.
func TestLabExamplesDirectory(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: examples("")})
	if err == nil || !strings.Contains(err.Error(), "2 of 13 file(s):\n  ../../../deploy/examples/passthrough.yaml:\n    claim passthrough cannot be allocated on this node:\n        request gpu: class passthrough.gpu.hwdra.io has no device on this node\n  ../../../deploy/examples/vgpu.yaml:\n    claim vgpu cannot be allocated on this node:\n        request vgpu: class vgpu.gpu.hwdra.io has no device on this node") {
		t.Errorf("error %v", err)
	}
	wantOutput(t, out.String(), "gpu-full: unprepared", "mig-1g-10gb: unprepared", "vf-share-10g: unprepared", "vf-configured: unprepared", "gpu-and-vf-same-numa: unprepared",
		"first-available: unprepared", "mig-on-distinct-gpus: unprepared", "gpu-share: unprepared", "gpu-share-dedicated: unprepared", "gpu-mps: unprepared", "gpu-timeslicing: unprepared", "../../../deploy/examples/vgpu.yaml: not allocated", "../../../deploy/examples/passthrough.yaml: not allocated")
	if t.Failed() {
		t.Log(out.String())
	}
}

// TestLabNotesRoundedCapacity: a capacity the request policy rounds (a
// negative one too: the API server takes any) is allocated as rounded,
// and the lab says so.
func TestLabNotesRoundedCapacity(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:cx7", ClaimFiles: []string{"-"},
		Stdin: strings.NewReader(claimYAML("neg", "exactly: {deviceClassName: vf-share.sriov.hwdra.io, capacity: {requests: {sriov.hwdra.io/bandwidth: -10G}}}"))})
	if err != nil {
		t.Fatal(err)
	}
	if want := "note: claim neg, request gpu asks for -10G of sriov.hwdra.io/bandwidth; the allocator counts 1G"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}

// TestLabLogsInPlace: what the agent's parts log is in the lab's output,
// marked, not on its own stream; the checkpoint entry in a CDI spec is
// named, not dumped.
func TestLabLogsInPlace(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: examples("gpu-full.yaml")}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	prep := strings.Index(got, "== Prepare: gpu.hwdra.io ==")
	logLine := strings.Index(got, "NVIDIA driver's files generated from the driver root")
	if prep < 0 || logLine < prep || !strings.HasPrefix(got[strings.LastIndex(got[:logLine], "\n")+1:], "log: \"") {
		t.Errorf("the log line is not in the prepare section:\n%s", got)
	}
	if !strings.Contains(got, "hwdra.io/claim: '(checkpoint entry, ") || strings.Contains(got, `"bootID"`) {
		t.Errorf("the CDI spec's checkpoint entry is shown whole:\n%s", got)
	}
}

// TestLabVGPUShares: two claims for a time-sliced vGPU type share the
// type's block on a GPU (one device, allowMultipleAllocations), and
// prepare makes a vGPU for each share.
func TestLabVGPUShares(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for _, name := range []string{"a", "b"} {
		p := filepath.Join(dir, name+".yaml")
		req := `exactly: {deviceClassName: vgpu.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "H100-10C"'}}]}`
		if err := os.WriteFile(p, []byte(claimYAML("share-"+name, req)), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:h100-vgpu", ClaimFiles: files}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	// Both shares on the first GPU's block, each with a vGPU of its own.
	if n := strings.Count(got, "gpu-0000-1b-00-0-vgpu-h100-10c-0"); n < 2 {
		t.Errorf("the block is named %d times, want both claims on it", n)
	}
	uuids := regexp.MustCompile(`HWDRA_GPU_0000_1B_00_0_VGPU_H100_10C_0_MDEV=(\S+)`).FindAllStringSubmatch(got, -1)
	if len(uuids) != 2 || uuids[0][1] == uuids[1][1] {
		t.Errorf("mdev UUIDs %v, want one of its own per share", uuids)
	}
	wantOutput(t, got, "share-a: unprepared", "share-b: unprepared")
	if t.Failed() {
		t.Log(got)
	}
}

// TestLabLeanMIG: an AgentConfig that leaves MIG profiles out publishes
// fewer devices, and a claim for a profile it keeps still fits.
func TestLabLeanMIG(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus:\n  migProfiles:\n    include: [1g.10gb, 3g.40gb, 7g.80gb]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ConfigPath: cfg, ClaimFiles: examples("mig-1g.10gb.yaml")}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"gpu.hwdra.io: 96 devices", "mig-1g-10gb: unprepared"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q\n%s", want, out.String())
		}
	}
}

// TestLabSettingsLeave: with gpus.settings Leave on GPUs with MIG off the
// node publishes no MIG partition (a MIG claim is not allocated), shares
// and an MPS claim prepare, and a time-slicing claim is refused at
// prepare naming the setting: the configuration reaches both the slices
// and the GPU driver.
func TestLabSettingsLeave(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus: {settings: Leave}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ConfigPath: cfg,
		ClaimFiles: examples("gpu-share.yaml", "gpu-mps.yaml", "gpu-timeslicing.yaml", "mig-1g.10gb.yaml")})
	for _, want := range []string{
		"prepare gpu-timeslicing: claim default/gpu-timeslicing", "gpus.settings: Leave",
		"claim mig-1g-10gb cannot be allocated on this node", // no MIG partition published
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v: want it to say %q", err, want)
		}
	}
	wantOutput(t, out.String(),
		"gpu.hwdra.io: 16 devices", // per GPU its whole GPU and share device
		"CDI spec of gpu-share", "CDI spec of gpu-mps",
		`MPS serves a GPU in compute mode Default`,
	)
	if t.Failed() {
		t.Log(out.String())
	}
}
