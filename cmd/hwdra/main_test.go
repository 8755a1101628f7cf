// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/tools/doctor"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// Logging is configured once per process; each run configures it anew.
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestSlicesPrintsApplicableResourceSlices(t *testing.T) {
	out, err := run(t, "slices", "--hardware", "mock:dgx-h100", "--node-name", "worker-1", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	drivers := map[string]int{}
	names := map[string]bool{}
	for {
		var s resourceapi.ResourceSlice
		if err := dec.Decode(&s); err != nil {
			break
		}
		if s.APIVersion != "resource.k8s.io/v1" || s.Kind != "ResourceSlice" || s.Name == "" || names[s.Name] {
			t.Fatalf("bad object header: %s %s %q", s.APIVersion, s.Kind, s.Name)
		}
		names[s.Name] = true
		if s.Spec.NodeName == nil || *s.Spec.NodeName != "worker-1" || s.Spec.Pool.Name != "worker-1" || s.Spec.Pool.ResourceSliceCount < 1 {
			t.Fatalf("%s: bad spec node/pool: %+v", s.Name, s.Spec.Pool)
		}
		drivers[s.Spec.Driver]++
	}
	if drivers["gpu.hwdra.io"] < 2 || drivers["sriov.hwdra.io"] < 1 {
		t.Fatalf("slices per driver: %v", drivers)
	}
}

// TestSlicesLeavesTheDevicePluginItsGPUs: with devicePlugin.ownedGPUs the
// slices hold only the agent's GPUs, as the agent publishes them.
func TestSlicesLeavesTheDevicePluginItsGPUs(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ndevicePlugin:\n  ownedGPUs: {pciAddresses: [\"0000:1b:00.0\"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "slices", "--hardware", "mock:dgx-h100", "--node-name", "worker-1", "--config", cfg, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	gpus := map[string]bool{}
	for {
		var s resourceapi.ResourceSlice
		if err := dec.Decode(&s); err != nil {
			break
		}
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["resource.kubernetes.io/pciBusID"]; ok && s.Spec.Driver == "gpu.hwdra.io" {
				gpus[*a.StringValue] = true
			}
		}
	}
	if len(gpus) != 1 || !gpus["0000:1b:00.0"] {
		t.Fatalf("GPUs in the slices: %v, want 0000:1b:00.0 alone", gpus)
	}
}

func TestProbeJSON(t *testing.T) {
	out, err := run(t, "probe", "--hardware", "mock:dgx-h100", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"productName": "NVIDIA H100 80GB HBM3"`, `"pciBusID": "0000:1b:00.0"`, `"pfs"`} {
		if !strings.Contains(out, want) {
			t.Errorf("probe output lacks %s", want)
		}
	}
}

func TestBadInputFails(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("gpus:\n- model: h100-80gb\n  count: 1\n  colour: blue\n"), 0o644)
	under := filepath.Join(bad, "state") // a directory under a file
	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n"+
		"contexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n"), 0o600)
	t.Setenv("KUBECONFIG", kubeconfig)
	cases := map[string]struct {
		args []string
		want string
	}{
		"unknown profile": {[]string{"slices", "--hardware", "mock:nope", "--node-name", "n"}, `unknown mock profile "nope"`},
		"bad yaml field":  {[]string{"probe", "--hardware", "mock:" + bad}, `unknown field "gpus[0].colour"`},
		"bad hardware":    {[]string{"probe", "--hardware", "gpu"}, `--hardware "gpu"`},
		"no node name":    {[]string{"slices", "--hardware", "mock:cx7"}, "--node-name is required"},
		"bad output":      {[]string{"probe", "--hardware", "mock:cx7", "-o", "xml"}, `--output "xml"`},
		"bad qps":         {[]string{"agent", "--node-name", "n", "--kube-api-qps", "0"}, "--kube-api-qps must be above 0"},
		"agent state under a file": {[]string{"agent", "--node-name", "n", "--state-dir", under},
			"--state-dir " + under + ": " + bad + " is a file, not a directory"},
		"lab state under a file": {[]string{"lab", "--hardware", "mock:cx7", "--claim", "../../deploy/examples/vf-share-10g.yaml", "--state-dir", under},
			"--state-dir " + under + ": " + bad + " is a file, not a directory"},
		"no kubelet registrar directory": {[]string{"agent", "--node-name", "n", "--state-dir", filepath.Join(dir, "s"), "--cdi-dir", filepath.Join(dir, "c"),
			"--kubelet-plugins-dir", filepath.Join(dir, "p"), "--kubelet-registrar-dir", filepath.Join(dir, "none")},
			"--kubelet-registrar-dir " + filepath.Join(dir, "none") + ": no such directory (the kubelet makes it"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// TestMockInject: the command reaches the mock hardware a process runs,
// which applies the fault; bad invocations say what is wrong.
func TestMockInject(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	h := mocktest.Open(t, "dgx-h100")
	pf := h.NICs().Netdevs()[0]
	trust := func() error {
		return h.NICs().VFConfigurator().SetVF(hw.VFRef{PF: pf, Index: 0}, hw.VFConfig{Trust: true})
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
		check   func() bool
	}{
		{args: []string{"xid", "--gpu", "0000:1b:00.0", "--code", "48"}, check: func() bool {
			g, _ := mustState(t, dir).GPU("0000:1b:00.0")
			return g.RecoveryAction == 1
		}},
		{args: []string{"gpu-lost", "--gpu", "0000:43:00.0"}, check: func() bool {
			g, _ := mustState(t, dir).GPU("0000:43:00.0")
			return g.Lost
		}},
		{args: []string{"clear", "--gpu", "0000:43:00.0"}, check: func() bool {
			g, _ := mustState(t, dir).GPU("0000:43:00.0")
			return !g.Lost
		}},
		{args: []string{"link", "--pf", "0000:18:00.0", "--state", "down"}, check: func() bool {
			return len(mustState(t, dir).LinksDown) == 1
		}},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "8388609:24Gi:mps", "--process", "8388608:512Mi"}, check: func() bool {
			g, _ := mustState(t, dir).GPU("0000:52:00.0")
			return len(g.Processes) == 2 && g.Processes[0].PID == 8388608 && !g.Processes[0].MPS && *g.Processes[0].UsedMemory == 512<<20 &&
				g.Processes[1].PID == 8388609 && g.Processes[1].MPS && *g.Processes[1].UsedMemory == 24<<30
		}},
		{args: []string{"processes", "--gpu", "0000:52:00.0"}, check: func() bool {
			g, _ := mustState(t, dir).GPU("0000:52:00.0")
			return len(g.Processes) == 0
		}},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "x:1Gi"}, wantErr: `--process "x:1Gi": PID "x" is not a process ID above 0`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "0:1Gi"}, wantErr: `--process "0:1Gi": PID "0"`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "42:lots"}, wantErr: `--process "42:lots": memory "lots" is not a size like 24Gi`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "42:-1Gi"}, wantErr: `memory "-1Gi"`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "42"}, wantErr: `--process "42": want PID:MEMORY or PID:MEMORY:mps`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "42:1Gi:mpx"}, wantErr: `--process "42:1Gi:mpx": want PID:MEMORY`},
		{args: []string{"processes", "--gpu", "0000:52:00.0", "--process", "42:1Ti"}, wantErr: "process 42: 1099511627776 bytes of GPU memory"},
		{args: []string{"processes", "--gpu", "0000:99:00.0"}, wantErr: "no GPU 0000:99:00.0"},
		{args: []string{"processes", "--process", "42:1Gi"}, wantErr: "processes needs --gpu"},
		{args: []string{"xid", "--gpu", "0000:1b:00.0", "--code", "48", "--process", "42:1Gi"}, wantErr: "xid takes no --process"},
		{args: []string{"xid", "--gpu", "0000:1b:00.0"}, wantErr: "xid needs --code"},
		{args: []string{"clear", "--gpu", "0000:1b:00.0", "--code", "1"}, wantErr: "clear takes no --code"},
		{args: []string{"link", "--pf", "x", "--state", "sideways"}, wantErr: `--state "sideways" is not down or up`},
		// A stall is the process's alone (not persisted): the agent's
		// health tests see what it does; here, that the process took it.
		{args: []string{"stall", "--gpu", "0000:1b:00.0"}, check: func() bool { return true }},
		{args: []string{"resume", "--gpu", "0000:1b:00.0"}, check: func() bool { return true }},
		{args: []string{"stall"}, wantErr: "stall needs --gpu"},
		{args: []string{"resume", "--gpu", "0000:1b:00.0", "--code", "1"}, wantErr: "resume takes no --code"},
		{args: []string{"stall", "--gpu", "0000:99:00.0"}, wantErr: "no GPU 0000:99:00.0"},
		{args: []string{"vf-refuse", "--pf", pf, "--setting", "trust"}, check: func() bool {
			err := trust()
			return err != nil && strings.Contains(err.Error(), "setting trust: operation not permitted")
		}},
		{args: []string{"vf-refuse", "--pf", pf}, check: func() bool { return trust() == nil }},
		{args: []string{"vf-refuse", "--pf", pf, "--setting", "colour"}, wantErr: `no VF setting "colour"`},
		{args: []string{"vf-refuse", "--setting", "trust"}, wantErr: "vf-refuse needs --pf"},
		{args: []string{"vf-refuse", "--pf", pf, "--gpu", "0000:1b:00.0"}, wantErr: "vf-refuse takes no --gpu"},
		{args: []string{"melt"}, wantErr: `unknown fault "melt"`},
		{args: []string{"xid", "--gpu", "0000:99:00.0", "--code", "48"}, wantErr: "no GPU 0000:99:00.0"},
	} {
		out, err := run(t, append([]string{"mock", "inject", "--mock-dir", dir}, tc.args...)...)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !strings.Contains(out, "injected") || !tc.check() {
			t.Errorf("%v: %q %v, or the hardware did not change", tc.args, out, err)
		}
	}
}

func mustState(t *testing.T, dir string) persist.State {
	t.Helper()
	s, err := persist.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hwdra ", "commit: ", "go: go1."} {
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
}

// TestLabTakesSeveralFilesAfterOneFlag: "--claim a.yaml b.yaml", as a shell
// glob gives it.
func TestLabTakesSeveralFilesAfterOneFlag(t *testing.T) {
	ex := filepath.Join("..", "..", "deploy", "examples")
	out, err := run(t, "lab", "--hardware", "mock:dgx-h100", "--claim", filepath.Join(ex, "gpu-full.yaml"), filepath.Join(ex, "mig-1g.10gb.yaml"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "gpu-full: unprepared") || !strings.Contains(out, "mig-1g-10gb: unprepared") {
		t.Errorf("both claims not run:\n%s", out)
	}
}

func TestPoolStatusOutputFormat(t *testing.T) {
	_, err := run(t, "pool-status", "-o", "xml")
	if err == nil || !strings.Contains(err.Error(), "want table, yaml or json") {
		t.Fatalf("pool-status -o xml: %v", err)
	}
}

// TestKubeConfig: the agent and pool-status find the API server as kubectl
// does, say where from, and without any kubeconfig say how to give one.
func TestKubeConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, server string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \""+server+"\"}}]\n"+
			"contexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n"), 0o600)
		return p
	}
	env, flag := write("env.yaml", "https://127.0.0.1:1"), write("flag.yaml", "https://127.0.0.1:2")
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod

	t.Setenv("KUBECONFIG", env)
	if rc, source, err := kubeConfig(""); err != nil || rc.Host != "https://127.0.0.1:1" || source != "$KUBECONFIG "+env {
		t.Errorf("$KUBECONFIG: %v %q %v", rc, source, err)
	}
	if rc, source, err := kubeConfig(flag); err != nil || rc.Host != "https://127.0.0.1:2" || source != "--kubeconfig "+flag {
		t.Errorf("--kubeconfig: %v %q %v", rc, source, err)
	}

	t.Setenv("KUBECONFIG", "")
	if _, err := os.Stat(clientcmd.RecommendedHomeFile); err == nil {
		t.Skipf("%s exists: no test without any kubeconfig", clientcmd.RecommendedHomeFile)
	}
	for _, args := range [][]string{{"pool-status"}, {"agent", "--node-name", "n", "--hardware", "mock:cx7"}} {
		_, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "no kubeconfig: give one with --kubeconfig FILE or $KUBECONFIG, or put it at "+clientcmd.RecommendedHomeFile) ||
			strings.Contains(err.Error(), "KUBERNETES_MASTER") {
			t.Errorf("%s without a kubeconfig: %v", args[0], err)
		}
	}
}

// TestDoctor: `hwdra doctor` fails (exits non-zero) on a blocker and only
// then, warnings pass; -o json is the report; without a kubeconfig the API
// checks are skipped, and one whose server does not answer blocks.
func TestDoctor(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	dir := t.TempDir()
	flags := []string{"doctor", "--hardware", "mock:cx7", "--kubelet-registrar-dir", dir, "--kubelet-plugins-dir", dir,
		"--cdi-dir", filepath.Join(dir, "cdi"), "--state-dir", filepath.Join(dir, "state"), "--nri-socket", filepath.Join(dir, "nri.sock")}

	// Warnings only (no NRI socket on a node with PFs): success.
	out, err := run(t, flags...)
	if err != nil || !strings.Contains(out, "WARN     nri ") || !strings.Contains(out, "0 blocker(s), 1 warning(s)") ||
		!strings.Contains(out, "SKIP     api-server       API checks skipped: no kubeconfig") {
		t.Errorf("warnings only: %v\n%s", err, out)
	}

	// A blocker: failure, naming it, after the report.
	missing := append(slices.Clone(flags), "--kubelet-registrar-dir", filepath.Join(dir, "none"))
	out, err = run(t, missing...)
	if err == nil || err.Error() != "1 blocker(s): kubelet-dirs" || !strings.Contains(out, "BLOCKER  kubelet-dirs ") {
		t.Errorf("without the kubelet's registry: %v\n%s", err, out)
	}

	out, err = run(t, append(missing, "-o", "json")...)
	var rep doctor.Report
	// The output is the report; cobra writes the error after it (to stderr,
	// the same buffer here).
	if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&rep); err == nil || jerr != nil || rep.Count(doctor.Blocker) != 1 || len(rep.Checks) < 15 {
		t.Errorf("-o json: %v, %v\n%s", err, jerr, out)
	}

	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n"+
		"contexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n"), 0o600)
	out, err = run(t, append(flags, "--kubeconfig", kubeconfig)...)
	if err == nil || !strings.Contains(err.Error(), "api-server") || !strings.Contains(out, "the API server https://127.0.0.1:1 (--kubeconfig "+kubeconfig+") does not answer") {
		t.Errorf("an API server that does not answer: %v\n%s", err, out)
	}
}
