// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/nicsim"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// AgentArgs are the flags the DaemonSet gives `hwdra agent`: the kubelet's
// registrar and plugin directories, containerd's CDI directory and NRI
// socket, a state directory of its own, and the agent's own (node-bound)
// credentials.
func (n *Node) AgentArgs(kubeconfig, hardware string) []string {
	return []string{
		"agent",
		"--node-name=" + n.Name,
		"--kubeconfig=" + kubeconfig,
		"--hardware=" + hardware,
		"--kubelet-registrar-dir=" + n.RegistrarDir(),
		"--kubelet-plugins-dir=" + n.PluginsDir(),
		"--cdi-dir=" + n.CDIDir,
		"--nri-socket=" + n.NRISocket,
		"--state-dir=" + filepath.Join(n.Root, "agent-state"),
	}
}

// AgentEnv is the agent process's environment on mock hardware: the mock's
// NIC netdevs are veth stand-ins in the agent's own network namespace (the
// node's), where the agent's NRI plugin moves them into pods; then extra.
func AgentEnv(extra ...string) []string {
	return append([]string{nicsim.VethEnv + "=1"}, extra...)
}

// StartProcess runs any program on the node (e.g. `hwdra agent ...` as the
// DaemonSet would), logging to the node's log directory. The returned
// process can be killed (SIGKILL), stopped and restarted; it is stopped when
// t ends.
func (n *Node) StartProcess(t testing.TB, name, path string, args ...string) *Process {
	t.Helper()
	p := n.newProcess(name, path, args...)
	if err := p.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- %s (last 40 lines)\n%s", name, p.Tail(40))
		}
		p.Stop(5 * time.Second)
	})
	return p
}

var (
	hwdraOnce sync.Once
	hwdraPath string
	hwdraErr  error
)

// errNoHwdra: cmd/hwdra has no Go files yet.
var errNoHwdra = errors.New("cmd/hwdra has no Go files yet")

// buildHwdra builds ./cmd/hwdra into dir.
func buildHwdra(dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if m, _ := filepath.Glob(filepath.Join(root, "cmd", "hwdra", "*.go")); len(m) == 0 {
		return "", errNoHwdra
	}
	path := filepath.Join(dir, "hwdra")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/hwdra")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/hwdra: %v: %s", err, out)
	}
	return path, nil
}

// HwdraBinary returns the hwdra binary: $HWDRA_BIN (which the suite sets
// after building ./cmd/hwdra before entering the namespace), or a fresh
// build. It skips t while the command does not exist yet and fails t when it
// does not build.
func HwdraBinary(t testing.TB) string {
	t.Helper()
	hwdraOnce.Do(func() {
		if p := os.Getenv(EnvHwdra); p != "" {
			hwdraPath = p
			return
		}
		dir := os.Getenv(envRoot)
		if dir == "" {
			if dir, hwdraErr = os.MkdirTemp("", "hwdra-bin-"); hwdraErr != nil {
				return
			}
		}
		hwdraPath, hwdraErr = buildHwdra(dir)
	})
	if errors.Is(hwdraErr, errNoHwdra) {
		t.Skip(hwdraErr)
	}
	if hwdraErr != nil {
		t.Fatal(hwdraErr)
	}
	return hwdraPath
}

// StartAgent runs `hwdra agent` as the node's DaemonSet would: the DaemonSet's
// flags, the agent's own node-bound credentials (never admin), hardware as
// given (e.g. "mock:dgx-h100"), extra flags appended.
func (n *Node) StartAgent(t testing.TB, hardware string, extra ...string) *Process {
	t.Helper()
	return n.StartAgentWithEnv(t, hardware, nil, extra...)
}

// WaitResourceSlices waits until driver has published at least one
// ResourceSlice for this node and returns them.
func (n *Node) WaitResourceSlices(ctx context.Context, driver string, timeout time.Duration) ([]resourceapi.ResourceSlice, error) {
	var items []resourceapi.ResourceSlice
	err := waitfor.Check(ctx, "a ResourceSlice of "+driver+" for node "+n.Name, timeout, func() error {
		list, err := n.Admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + n.Name + ",spec.driver=" + driver,
		})
		if err == nil && len(list.Items) == 0 {
			err = errors.New("none")
		}
		if err == nil {
			items = list.Items
		}
		return err
	})
	return items, err
}

// DeleteResourceSlices removes every ResourceSlice of this node (as admin).
func (n *Node) DeleteResourceSlices(ctx context.Context) {
	_ = n.Admin.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
}
