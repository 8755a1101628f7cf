// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package framework runs a real single-node Kubernetes for hwdra's
// end-to-end tests: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd and the kubelet, all inside a network namespace
// that the test run creates, so that the node IP and the pod network exist
// nowhere else. Only the hardware is mocked; every Kubernetes component is
// the real binary users run.
//
// The suite runs when HWDRA_REALNODE_BIN names the directory that
// hack/build-realnode.sh printed and the process is root; otherwise every test
// skips with the reason.
package framework

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Environment variables that configure the suite.
const (
	// EnvBin is the directory with the node's binaries (hack/build-realnode.sh).
	EnvBin = "HWDRA_REALNODE_BIN"
	// EnvHwdra optionally names a prebuilt hwdra binary; by default the
	// suite builds ./cmd/hwdra once per run.
	EnvHwdra = "HWDRA_BIN"
	// EnvArtifacts optionally names a directory that receives every
	// component's log after each node stops.
	EnvArtifacts = "HWDRA_E2E_ARTIFACTS"
	// EnvControlPlaneOnly=1 makes a run of control planes only
	// (Options.ControlPlaneOnly; hack/fleet.sh): no machine lock, no
	// images, no node; tests that need a node skip.
	EnvControlPlaneOnly = "HWDRA_E2E_CONTROL_PLANE_ONLY"
	// EnvIsolated=1 makes a run of isolated nodes: a cluster's workers
	// (NewCluster) live in network, mount and cgroup namespaces of their
	// own, and the run's other nodes (Shared, New) in a mount namespace
	// and a cgroup root of their own (isolated.go), so such a run takes
	// no machine lock and runs beside a run with the machine's node
	// (hack/e2e-realnode.sh runs the two side by side).
	EnvIsolated = "HWDRA_E2E_ISOLATED"
	// EnvSharedBuild optionally names a directory where runs side by
	// side build the images and hwdra once (prebuild).
	EnvSharedBuild = "HWDRA_E2E_SHARED_BUILD"
	// EnvKeep keeps the run's temp directory (not the processes) for
	// debugging.
	EnvKeep = "HWDRA_E2E_KEEP"

	// envChild marks the re-executed test binary that runs inside the
	// namespace; envRoot passes it the run's temp directory.
	envChild = "HWDRA_E2E_CHILD"
	envRoot  = "HWDRA_E2E_ROOT"
	// envNetns names the run's network namespace (a cluster's workers'
	// are named after it).
	envNetns = "HWDRA_E2E_NETNS"
	// envAgentImages and envHelm pass the agent's image archives and the
	// helm CLI, built before entering the namespace, to the child.
	envAgentImages = "HWDRA_E2E_AGENT_IMAGES"
	envHelm        = "HWDRA_E2E_HELM"
)

// Binaries are the node's executables.
var nodeBinaries = []string{
	"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
	"containerd", "containerd-shim-runc-v2", "ctr", "bridge", "host-local", "loopback",
}

// runcPath is Debian's runc; containerd's config names it explicitly.
const runcPath = "/usr/sbin/runc"

// skipReason is set once in Main: why this run cannot start a node, or "".
var skipReason string

// checkEnvironment says why a real node cannot run here, or nil.
func checkEnvironment() error {
	dir := os.Getenv(EnvBin)
	if dir == "" {
		return fmt.Errorf("%s is not set (run hack/build-realnode.sh and set it to the directory it prints)", EnvBin)
	}
	if os.Geteuid() != 0 {
		return errors.New("not root: the node needs network namespaces, mounts and cgroups")
	}
	var missing []string
	for _, b := range nodeBinaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %v", dir, missing)
	}
	if _, err := os.Stat(runcPath); err != nil {
		return fmt.Errorf("%s missing (apt-get install runc)", runcPath)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("ip (iproute2) missing")
	}
	return nil
}

// binDir is the directory with the node's binaries.
func binDir() string { return os.Getenv(EnvBin) }

func bin(name string) string { return filepath.Join(binDir(), name) }

// ControlPlaneOnlyRun says whether this run starts control planes only.
func ControlPlaneOnlyRun() bool { return os.Getenv(EnvControlPlaneOnly) == "1" }

// IsolatedRun says whether this run's nodes are isolated (EnvIsolated).
func IsolatedRun() bool { return os.Getenv(EnvIsolated) == "1" }

// nodeRun says whether this run may start a node in the machine's own
// mount and cgroup namespaces (Shared, New): one such run at a time.
func nodeRun() bool { return !ControlPlaneOnlyRun() && !IsolatedRun() }
