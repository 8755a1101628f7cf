// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/diff"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// Mock hardware that outlives the agent, as real hardware does: the agent
// runs with mock's HWDRA_MOCK_DIR set to a directory of the test, so a
// killed and restarted agent finds the GPU instances, mediated devices and
// VF settings the killed one left, and a test reads that state from
// outside (persist.ReadState) to tell what leaked.

// MockDir makes an empty directory for t's persistent mock hardware: a
// tmpfs of its own under the node's root (the mock's sysfs trees are
// thousands of files; the node's teardown and the next run's sweep
// unmount it like any mount under the root), unmounted and removed when t
// ends. Call it before starting the agent that uses it, so that it goes
// after that agent stopped.
func (n *Node) MockDir(t testing.TB) string {
	t.Helper()
	return mockDirUnder(t, n.Root)
}

// mockDirUnder is MockDir in parent.
func mockDirUnder(t testing.TB, parent string) string {
	t.Helper()
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp(parent, "mock-")
	if err != nil {
		t.Fatal(err)
	}
	mounted := unix.Mount("tmpfs", base, "tmpfs", 0, "size=512m,mode=0755") == nil
	t.Cleanup(func() {
		if mounted {
			if err := unix.Unmount(base, unix.MNT_DETACH); err != nil {
				t.Logf("unmount %s: %v", base, err)
			}
		}
		os.RemoveAll(base)
	})
	// A subdirectory: the mock creates it, as an operator's first run would.
	return filepath.Join(base, "hw")
}

// StartAgentWithEnv is StartAgent with environment variables for the agent
// process, e.g. persist.DirEnv+"="+n.MockDir(t), after AgentEnv's. Kill the
// returned process and Start it again to restart the agent with the same
// flags and environment (change its Env in between for another
// environment, starting from AgentEnv). Registered before the process's
// own cleanup, the deletion of the node's slices runs after the agent
// stopped: the next test starts without them (the kubelet removes them
// only after a grace period).
func (n *Node) StartAgentWithEnv(t testing.TB, hardware string, env []string, extra ...string) *Process {
	t.Helper()
	return n.StartAgentBinary(t, HwdraBinary(t), hardware, env, extra...)
}

// StartAgentBinary is StartAgentWithEnv with a given hwdra binary (to
// compare builds).
func (n *Node) StartAgentBinary(t testing.TB, bin, hardware string, env []string, extra ...string) *Process {
	t.Helper()
	creds, err := n.AgentCredentials(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	args := append(n.AgentArgs(creds.Kubeconfig, hardware), extra...)
	t.Cleanup(func() { n.DeleteResourceSlices(context.Background()) })
	p := n.newProcess("hwdra-agent", bin, args...)
	p.Env = AgentEnv(env...)
	if err := p.Start(); err != nil {
		t.Fatalf("start hwdra-agent: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- hwdra-agent (last 60 lines)\n%s", p.Tail(60))
		}
		p.Stop(5 * time.Second)
	})
	return p
}

// WaitMockState waits until cond holds for the mock hardware's state in dir
// and returns that state; the error shows the last state read.
func WaitMockState(ctx context.Context, dir string, timeout time.Duration, what string, cond func(persist.State) bool) (persist.State, error) {
	var s persist.State
	err := waitfor.Check(ctx, "mock hardware in "+dir+": "+what, timeout, func() error {
		var err error
		if s, err = persist.ReadState(dir); err == nil && !cond(s) {
			err = fmt.Errorf("last state:\n%s", StateJSON(s))
		}
		return err
	})
	return s, err
}

// WaitMockBusy waits until the mock hardware in dir is in the middle of a
// call (a GPUTimings or NICTimings name, e.g. "createGpuInstance"; it takes
// as long as the timings given to the mock say) and returns it.
func WaitMockBusy(ctx context.Context, dir, call string, timeout time.Duration) (persist.Operation, error) {
	var op persist.Operation
	_, err := WaitMockState(ctx, dir, timeout, "busy with "+call, func(s persist.State) bool {
		for _, o := range s.Busy {
			if o.Call == call {
				op = o
				return true
			}
		}
		return false
	})
	return op, err
}

// HardwareDiff is how the hardware differs between two states (what
// persist.State.Hardware keeps), "" when it does not.
func HardwareDiff(before, after persist.State) string {
	b, a := before.Hardware(), after.Hardware()
	if reflect.DeepEqual(b, a) {
		return ""
	}
	return diff.Diff(b, a)
}

// StateJSON is a state for a test's log.
func StateJSON(s persist.State) string {
	s.Spec = nil
	b, _ := json.MarshalIndent(s, "", "  ")
	return string(b)
}

// AgentRecords is what an agent's state directory says about one driver:
// the claims in its checkpoint (UID -> state, "Preparing" or "Prepared")
// and the hardware state in its ledger (keys: "gi/...", "mdev/...",
// "migmode/..." for gpu.hwdra.io, VF PCI addresses for sriov.hwdra.io).
type AgentRecords struct {
	Claims map[string]string
	Ledger []string
	// Placements are the VFs (PCI addresses) the NRI plugin has in pods
	// (sriov.hwdra.io.netns.json).
	Placements []string
}

// ReadAgentRecords reads a driver's checkpoint and ledger in an agent's
// --state-dir (missing files are empty). It reads the files' data as an
// operator would look at them (internal/state: the newer of each file's
// two slots, in the current version), without the prepare package.
func ReadAgentRecords(stateDir, driver string) (AgentRecords, error) {
	out := AgentRecords{Claims: map[string]string{}}
	raw, err := state.Read(filepath.Join(stateDir, driver+".checkpoint.json"), state.CheckpointFormat)
	if err != nil {
		return out, err
	}
	if raw != nil {
		var cp struct {
			Claims map[string]struct {
				State string `json:"state"`
			} `json:"claims"`
		}
		if err := json.Unmarshal(raw, &cp); err != nil {
			return out, fmt.Errorf("checkpoint of %s: %w", driver, err)
		}
		for uid, c := range cp.Claims {
			out.Claims[uid] = c.State
		}
	}
	if out.Ledger, err = ledgerKeys(filepath.Join(stateDir, driver+".ledger.json")); err != nil {
		return out, err
	}
	out.Placements, err = ledgerKeys(filepath.Join(stateDir, driver+".netns.json"))
	return out, err
}

// ledgerKeys are the keys of a ledger file (state.Ledger), sorted.
func ledgerKeys(path string) ([]string, error) {
	raw, err := state.Read(path, state.LedgerFormat)
	if err != nil || raw == nil {
		return nil, err
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var keys []string
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

// ClaimFiles lists what the node holds for a claim outside the agent's own
// state: CDI spec files in the CDI directory that mention its UID (the
// driver's claim spec, the library's metadata specs) and the library's
// metadata directory for it under the driver's plugin directory.
func (n *Node) ClaimFiles(driver, namespace, name, uid string) []string {
	var out []string
	files, _ := filepath.Glob(filepath.Join(n.CDIDir, "*"))
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), uid) {
			out = append(out, f)
		}
	}
	// k8s.io/dynamic-resource-allocation kubeletplugin (metadata.go).
	meta := filepath.Join(n.PluginsDir(), driver, "dra-device-metadata", namespace+"_"+name)
	if _, err := os.Stat(meta); err == nil {
		out = append(out, meta)
	}
	return out
}
