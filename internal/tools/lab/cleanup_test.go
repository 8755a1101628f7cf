// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/state"
)

// labDirs are a lab run's directories that outlive it: the mock
// hardware's (persist.DirEnv) and the state and CDI directories.
type labDirs struct {
	mock, state, cdi string
	// before is the mock hardware's state before the run.
	before persist.State
}

// persistentMock makes the mock hardware of a profile outlive each process
// that opens it (persist.DirEnv, for this test), lets setup change it, and
// notes its state before the lab runs.
func persistentMock(t *testing.T, profile string, setup func(h *mock.Hardware) error) labDirs {
	t.Helper()
	root := t.TempDir()
	d := labDirs{mock: filepath.Join(root, "mock"), state: filepath.Join(root, "state"), cdi: filepath.Join(root, "cdi")}
	t.Setenv(persist.DirEnv, d.mock)
	h, err := mock.Open(profile)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		err = setup(h)
	}
	if err := errors.Join(err, h.Close()); err != nil {
		t.Fatal(err)
	}
	if d.before, err = persist.ReadState(d.mock); err != nil {
		t.Fatal(err)
	}
	// Whatever a failing test (or one that leaves claims prepared) leaves
	// running ends with it, and the daemons' shared memory is unmounted.
	t.Cleanup(func() {
		for _, pid := range mpsDaemons(d.state) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		shms, _ := filepath.Glob(filepath.Join(d.state, "mps", "*", "shm"))
		for _, shm := range shms {
			_ = syscall.Unmount(shm, syscall.MNT_DETACH)
		}
	})
	return d
}

func asJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", " ")
	return string(b)
}

// checkNothingLeft: the hardware is as before the run, no claim's CDI
// spec is left, no ledger, checkpoint or MPS record holds anything, and no
// MPS control daemon of the run's state directory runs.
func checkNothingLeft(t *testing.T, d labDirs) {
	t.Helper()
	after, err := persist.ReadState(d.mock)
	if err != nil {
		t.Fatal(err)
	}
	got, want := after.Hardware(), d.before.Hardware()
	for i := range max(len(got.GPUs), len(want.GPUs)) {
		var g, w persist.GPUState
		if i < len(got.GPUs) {
			g = got.GPUs[i]
		}
		if i < len(want.GPUs) {
			w = want.GPUs[i]
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("GPU %s differs from before the run:\n%s\nwant\n%s", w.BusID, asJSON(g), asJSON(w))
		}
	}
	got.GPUs, want.GPUs = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the hardware differs from before the run:\n%s\nwant\n%s", asJSON(got), asJSON(want))
	}
	specs, _ := filepath.Glob(filepath.Join(d.cdi, "*"))
	if len(specs) > 0 {
		t.Errorf("CDI specs left: %v", specs)
	}
	for _, f := range []struct {
		file   string
		format state.Format
	}{
		{device.GPUDriver + ".ledger.json", state.LedgerFormat},
		{device.GPUDriver + ".mps.json", state.LedgerFormat},
		{device.NICDriver + ".ledger.json", state.LedgerFormat},
		{device.GPUDriver + ".checkpoint.json", state.CheckpointFormat},
		{device.NICDriver + ".checkpoint.json", state.CheckpointFormat},
	} {
		data, err := state.Read(filepath.Join(d.state, f.file), f.format)
		if err != nil {
			t.Errorf("%s: %v", f.file, err)
			continue
		}
		if data == nil {
			continue
		}
		var entries map[string]json.RawMessage
		if f.format.Kind == state.CheckpointFormat.Kind {
			var cp struct {
				Claims map[string]json.RawMessage `json:"claims"`
			}
			err = json.Unmarshal(data, &cp)
			entries = cp.Claims
		} else {
			err = json.Unmarshal(data, &entries)
		}
		if err != nil || len(entries) > 0 {
			t.Errorf("%s holds %s (%v)", f.file, data, err)
		}
	}
	if pids := mpsDaemons(d.state); len(pids) > 0 {
		t.Errorf("MPS control daemons of %s still run: %v", d.state, pids)
	}
}

// mpsDaemons are the processes running with a pipe directory under
// stateDir: the mock's MPS control daemons the run started.
func mpsDaemons(stateDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	want := []byte(mps.PipeDirEnv + "=" + stateDir + string(filepath.Separator))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue // gone, or not ours
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if bytes.HasPrefix(v, want) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// TestLabUndoesAfterABadFile: a claim whose prepare fails after another
// prepared (its GPU's compute mode changed, its MPS daemon running) is
// not the end: the lab undoes the first and says so.
func TestLabUndoesAfterABadFile(t *testing.T) {
	d := persistentMock(t, "dgx-h100", nil)
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	// A config that reads well and that only prepare, which knows the
	// device, refuses: a 1g.10gb partition has no 2-slice compute instance.
	if err := os.WriteFile(bad, []byte(claimYAML("bad-config", `exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}}]}`)+`    config:
    - requests: [gpu]
      opaque:
        driver: gpu.hwdra.io
        parameters: {apiVersion: gpu.hwdra.io/v1alpha1, kind: GpuConfig, mig: {computeInstanceSlices: 2}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", StateDir: d.state, CDIDir: d.cdi,
		ClaimFiles: append(examples("gpu-mps.yaml"), bad)})
	if err == nil || !strings.Contains(err.Error(), `prepare bad-config: claim default/bad-config: request "gpu", device gpu-0000-`) {
		t.Errorf("error %v, want the bad file's", err)
	}
	checkNothingLeft(t, d)
	wantOutput(t, withoutLogs(out.String()),
		"== Undo: the run failed (the error is at the end) ==\n"+
			"bad-config: its prepare failed; rolled back (gpu.hwdra.io)\n"+
			"gpu-mps: unprepared (gpu.hwdra.io)\n"+
			"no GPU instances or MIG modes differ from the start\n"+
			"no MPS control daemons\n",
	)
	if t.Failed() {
		t.Log(out.String())
	}
}

// TestLabUndoesAfterAFailureMidway: a claim that fails half way through
// its prepare (its first MIG device made, on a GPU switched to MIG mode;
// its second refused: another process runs on that GPU, which keeps its
// MIG mode from changing) after two claims prepared: nothing of the three
// is left, --keep or not.
func TestLabUndoesAfterAFailureMidway(t *testing.T) {
	d := persistentMock(t, "dgx-h100", func(h *mock.Hardware) error { return h.SetRunningProcesses("0000:52:00.0", 4242) })
	split := filepath.Join(t.TempDir(), "split.yaml")
	onGPU := func(request, busID string) string {
		return "- name: " + request + `
      exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb" && device.attributes["resource.kubernetes.io"].pciBusID == "` + busID + `"'}}]}
    `
	}
	claim := "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: split}\nspec:\n  devices:\n    requests:\n    " +
		onGPU("a", "0000:61:00.0") + onGPU("b", "0000:52:00.0")
	if err := os.WriteFile(split, []byte(claim), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", StateDir: d.state, CDIDir: d.cdi, Keep: true,
		ClaimFiles: append(examples("gpu-mps.yaml", "mig-1g.10gb.yaml"), split)})
	if err == nil || !strings.Contains(err.Error(), "prepare split: claim default/split: ") {
		t.Errorf("error %v, want the split claim's", err)
	}
	// Request a's MIG device was made (a compute instance: the GPU's
	// creation count went up) before b's was refused.
	after, _ := persist.ReadState(d.mock)
	was, _ := d.before.GPU("0000:61:00.0")
	now, _ := after.GPU("0000:61:00.0")
	if now.NextSerial == was.NextSerial {
		t.Errorf("no compute instance was made on 0000:61:00.0: the claim failed before its first device, not midway")
	}
	checkNothingLeft(t, d)
	wantOutput(t, withoutLogs(out.String()),
		"note: --keep keeps the claims of a run in which every claim prepared, not what a failed one left\n"+
			"split: its prepare failed; rolled back (gpu.hwdra.io)\n"+
			"mig-1g-10gb: unprepared (gpu.hwdra.io)\n",
		"gpu-mps: unprepared (gpu.hwdra.io)\n"+
			"no GPU instances or MIG modes differ from the start\n"+
			"no MPS control daemons\n",
	)
	if strings.Contains(out.String(), "Kept prepared") {
		t.Error("a failed run says it kept its claims")
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// withoutLogs is the lab's output without the agent's log lines.
func withoutLogs(out string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(out, "\n") {
		if !strings.HasPrefix(line, "log: ") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// childEnv makes the test binary hwdra lab (TestMain): its value is the
// run's childOptions, JSON.
const childEnv = "HWDRA_LAB_TEST_CHILD"

type childOptions struct {
	Hardware, StateDir, CDIDir string
	ClaimFiles                 []string
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(labChild(spec))
	}
	os.Exit(m.Run())
}

// labChild runs the lab as cmd/hwdra does: the first SIGINT or SIGTERM
// cancels the run, the rest are answered while the undo goes on.
func labChild(spec string) int {
	var c childOptions
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), Signals...)
	defer stop()
	defer NoteRepeatedSignals(ctx, os.Stdout)()
	err := Run(ctx, os.Stdout, Options{Hardware: c.Hardware, StateDir: c.StateDir, CDIDir: c.CDIDir, ClaimFiles: c.ClaimFiles})
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

// child is a lab run in a process of its own.
type child struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	mu     sync.Mutex
	out    strings.Builder
	done   chan struct{} // closed once its output ends
}

// startChild runs the lab on claims in a process of its own, on d's
// mock hardware and directories, with extra environment.
func startChild(t *testing.T, d labDirs, claims []string, env ...string) *child {
	t.Helper()
	spec, err := json.Marshal(childOptions{Hardware: "mock:dgx-h100", StateDir: d.state, CDIDir: d.cdi, ClaimFiles: claims})
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: exec.Command(os.Args[0]), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), append(env, childEnv+"="+string(spec), persist.DirEnv+"="+d.mock)...)
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.out.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// waitFor polls a fact until it holds; the run ending first, or a minute
// passing, fails the test.
func (c *child) waitFor(t *testing.T, what string, fact func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !fact() {
		select {
		case <-c.done:
			if fact() {
				return
			}
			t.Fatalf("the lab ended before %s:\n%s\n%s", what, c.output(), c.stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute:\n%s", what, c.output())
		}
	}
}

// wait waits for the run to end and returns its exit code.
func (c *child) wait(t *testing.T) int {
	t.Helper()
	<-c.done
	err := c.cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return c.cmd.ProcessState.ExitCode()
}

// manyClaims writes claims of every kind that changes a GPU, interleaved
// (MIG partitions, GPU shares under one MPS daemon, whole GPUs with an
// MPS daemon each, time-sliced whole GPUs): enough to fill a DGX H100.
func manyClaims(t *testing.T) []string {
	dir := t.TempDir()
	kinds := []struct {
		n       int
		request string
		config  string
	}{
		{14, `exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}}]}`, ""},
		{10, `exactly: {deviceClassName: share.gpu.hwdra.io, capacity: {requests: {gpu.hwdra.io/memory: 4Gi, gpu.hwdra.io/compute: "10"}}}`, ""},
		{3, "exactly: {deviceClassName: gpu.hwdra.io}", "{strategy: MPS, mps: {defaultActiveThreadPercentage: 50}}"},
		{2, "exactly: {deviceClassName: gpu.hwdra.io}", "{strategy: TimeSlicing, timeSlicing: {interval: Long}}"},
	}
	var files []string
	for i := 0; ; i++ {
		k := &kinds[i%len(kinds)]
		if k.n == 0 {
			if kinds[0].n+kinds[1].n+kinds[2].n+kinds[3].n == 0 {
				return files
			}
			continue
		}
		k.n--
		name := fmt.Sprintf("c%02d", len(files))
		doc := claimYAML(name, k.request)
		if k.config != "" {
			doc += "    config:\n    - requests: [gpu]\n      opaque: {driver: gpu.hwdra.io, parameters: {apiVersion: gpu.hwdra.io/v1alpha1, kind: GpuConfig, sharing: " + k.config + "}}\n"
		}
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
	}
}

// count is how many entries a directory has.
func count(dir string) int {
	entries, _ := os.ReadDir(dir)
	return len(entries)
}

// TestLabUndoesOnSignal: SIGINT or SIGTERM while the lab prepares many
// claims (in a process of its own, as hwdra lab) ends the run with
// everything it prepared undone, the claim in the middle of its prepare
// included: its MPS daemon being started, or its MIG instances made.
func TestLabUndoesOnSignal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signal syscall.Signal
		// when: the fact the signal waits for.
		when string
		fact func(d labDirs) bool
	}{
		{"SIGINT while an MPS daemon starts", syscall.SIGINT, "a third MPS daemon starting",
			func(d labDirs) bool { return count(filepath.Join(d.state, "mps")) >= 3 }},
		{"SIGINT as an MPS daemon answers", syscall.SIGINT, "a third MPS daemon running",
			func(d labDirs) bool {
				logs, _ := filepath.Glob(filepath.Join(d.state, "mps", "*", "log", "control.log"))
				return len(logs) >= 3
			}},
		{"SIGTERM while MIG instances are made", syscall.SIGTERM, "ten claims prepared and a GPU instance being made",
			func(d labDirs) bool {
				s, _ := persist.ReadState(d.mock)
				return count(d.cdi) >= 10 && len(s.Busy) > 0
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := persistentMock(t, "dgx-h100", nil)
			c := startChild(t, d, manyClaims(t), persist.TimingsEnv+"=createGpuInstance=50ms")
			c.waitFor(t, tc.when, func() bool { return tc.fact(d) })
			if err := c.cmd.Process.Signal(tc.signal); err != nil {
				t.Fatal(err)
			}
			code := c.wait(t)
			out := c.output()
			cause := map[syscall.Signal]string{syscall.SIGINT: "interrupt", syscall.SIGTERM: "terminated"}[tc.signal] + " signal received"
			if want := "Error: interrupted (" + cause + ")"; code != 1 || !strings.Contains(c.stderr.String(), want) {
				t.Errorf("exit code %d, stderr %q: want 1 and %q", code, c.stderr.String(), want)
			}
			if want := "== Undo: interrupted (" + cause + ") =="; !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
			if n := strings.Count(out, ": unprepared ("); n < 3 {
				t.Errorf("%d claims unprepared, want the ones prepared before the signal", n)
			}
			checkNothingLeft(t, d)
			if t.Failed() || testing.Verbose() {
				t.Log(out, c.stderr.String())
			}
		})
	}
}

// TestLabUndoesOnTwoSignals: two SIGINTs, the second once the undo has
// begun (a user's Ctrl-C twice) while the lab prepares many claims: the second does not
// cut the undo short. Nothing is left: no MPS daemon, no claim's record,
// no CDI spec, no temporary directory of the run (TMPDIR is the test's).
func TestLabUndoesOnTwoSignals(t *testing.T) {
	d := persistentMock(t, "dgx-h100", nil)
	tmp := t.TempDir()
	d.state, d.cdi = "", "" // the run's own temporary directory
	c := startChild(t, d, manyClaims(t), "TMPDIR="+tmp, persist.TimingsEnv+"=destroyGpuInstance=100ms")
	c.waitFor(t, "a third MPS daemon running", func() bool {
		logs, _ := filepath.Glob(filepath.Join(tmp, "*", "state", "mps", "*", "log", "control.log"))
		return len(logs) >= 3
	})
	// The second Ctrl-C lands while the first one's undo runs.
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "the undo under way", func() bool { return strings.Contains(c.output(), "== Undo: interrupted") })
	if err := c.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code := c.wait(t)
	out := c.output()
	if code != 1 || !strings.Contains(c.stderr.String(), "Error: interrupted (interrupt signal received)") {
		t.Errorf("exit code %d, stderr %q", code, c.stderr.String())
	}
	if !strings.Contains(out, "interrupt again: the lab goes on undoing what it prepared") {
		t.Errorf("the second signal is not answered")
	}
	if strings.Contains(out, "left prepared") || strings.Contains(out, "Undo it with") {
		t.Errorf("the run left claims")
	}
	if pids := mpsDaemons(tmp); len(pids) > 0 {
		t.Errorf("MPS control daemons still run: %v", pids)
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("the run left %v in its temporary directory's parent", left)
	}
	after, err := persist.ReadState(d.mock)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := asJSON(after.Hardware()), asJSON(d.before.Hardware()); got != want {
		t.Errorf("the hardware differs from before the run:\n%s\nwant\n%s", got, want)
	}
	if t.Failed() || testing.Verbose() {
		t.Log(out, c.stderr.String())
	}
}

// recordingPlugin is a driver's plugin that records the unprepares it is
// asked for and how their contexts were.
type recordingPlugin struct {
	kubeletplugin.DRAPlugin
	calls []string
	// fail makes a claim's unprepare fail.
	fail map[string]error
}

func (p *recordingPlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		_, bounded := ctx.Deadline()
		p.calls = append(p.calls, fmt.Sprintf("%s live=%v bounded=%v", c.Name, ctx.Err() == nil, bounded))
		out[c.UID] = p.fail[c.Name]
	}
	return out, nil
}

// TestUndo: the undo takes back every claim handed to prepare, last first,
// the one whose prepare failed included (the plugin's own rollback ran on
// the run's context: where that was cancelled, it may have left the claim
// half-prepared), each on a live, bounded context although the run's is
// cancelled; an unprepare that fails leaves its claim, not the others.
// What it left is named, with where.
func TestUndo(t *testing.T) {
	node, err := backend.OpenWith("mock:cx7", backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	inv, _ := node.Inventory(context.Background())
	claim := func(name string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
	}
	run, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("interrupt signal received"))

	for name, tc := range map[string]struct {
		fail      map[string]error
		wantCalls []string
		wantOut   string
		wantErr   string
	}{
		"everything": {
			wantCalls: []string{"c live=true bounded=true", "b live=true bounded=true", "a live=true bounded=true"},
			wantOut: "\n== Undo: interrupted (interrupt signal received) ==\n" +
				"c: its prepare failed; rolled back (gpu.hwdra.io)\nb: unprepared (gpu.hwdra.io)\na: unprepared (gpu.hwdra.io)\n",
		},
		"an unprepare fails": {
			fail:      map[string]error{"b": errors.New("GPU in use")},
			wantCalls: []string{"c live=true bounded=true", "b live=true bounded=true", "a live=true bounded=true"},
			wantOut:   "b: not unprepared (gpu.hwdra.io): GPU in use\na: unprepared (gpu.hwdra.io)\n",
			wantErr:   "unprepare b: GPU in use\nleft prepared, their unprepare failed: b (gpu.hwdra.io); their records are in S (checkpoint, ledgers, MPS daemons' directories), their CDI specs in C",
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := &recordingPlugin{fail: tc.fail}
			handed := []handedClaim{
				{driver: device.GPUDriver, plugin: p, claim: claim("a")},
				{driver: device.GPUDriver, plugin: p, claim: claim("b")},
				{driver: device.GPUDriver, plugin: p, claim: claim("c"), failed: true},
			}
			var out bytes.Buffer
			left, err := undo(run, &out, context.Cause(run), handed, undoEnv{opts: Options{StateDir: "S", CDIDir: "C"}, node: node, before: inv})
			if !slices.Equal(p.calls, tc.wantCalls) {
				t.Errorf("unprepares %q, want %q", p.calls, tc.wantCalls)
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("output lacks %q:\n%s", tc.wantOut, out.String())
			}
			if left != (tc.wantErr != "") || tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Errorf("left %v, error %v; want the error %q", left, err, tc.wantErr)
			}
		})
	}
}
