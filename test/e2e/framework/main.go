// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The node's addresses. They exist only inside the run's network namespace:
// the node IP sits on a bridge there and pods get addresses from the same
// subnet through the CNI bridge plugin, so no packet ever leaves it.
const (
	NodeIP     = "10.200.0.1"
	PodCIDR    = "10.200.0.0/24"
	bridgeName = "e2ebr0"
)

// Main is the suite's TestMain. As root with HWDRA_REALNODE_BIN set it
// creates a network namespace, re-executes the test binary inside it, and
// after that exits sweeps whatever a crashed or timed-out run left behind.
// Otherwise it runs the tests, which skip.
func Main(m *testing.M) {
	if os.Getenv(envChild) != "" {
		code := m.Run()
		stopShared()
		os.Exit(code)
	}
	if err := checkEnvironment(); err != nil {
		skipReason = err.Error()
		fmt.Fprintf(os.Stderr, "hwdra e2e: real-node tests skip: %s\n", skipReason)
		os.Exit(m.Run())
	}
	os.Exit(runInNamespace())
}

// runInNamespace is the parent: it owns the namespace and the temp root and
// cleans both up whatever the child did.
func runInNamespace() int {
	// Short: unix socket paths under it must stay < 108 bytes. The pid in
	// the name lets a later run clean up after a killed one.
	root, err := os.MkdirTemp("", fmt.Sprintf("hwe2e-%d-", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The builds come before the machine lock: a run waiting for another
	// builds meanwhile, and holds the lock only while it runs nodes.
	built := prebuildFor(root)
	// One real node per machine at a time: nodes share the paths the
	// kubelet writes outside its root, and a run's teardown removes them.
	// A run of control planes only writes nothing there, and a run of
	// isolated nodes has its nodes in namespaces and cgroups of their
	// own: each runs beside one; they leave stale runs to the next run
	// with a node.
	node := nodeRun()
	if node {
		unlock, err := lockMachine()
		if err != nil {
			fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
			_ = os.RemoveAll(root)
			return 1
		}
		defer unlock()
		sweepStale()
	}
	ns := "hwdra-e2e-" + strconv.Itoa(os.Getpid())
	var fixed []string
	if node {
		fixed = snapshotFixedPaths()
	}
	defer func() {
		sweep(ns, root, fixed, node, func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "hwdra e2e: sweep: "+format+"\n", args...)
		})
	}()
	if err := createNamespace(ns); err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
		return 1
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envChild+"=1", envRoot+"="+root, envNetns+"="+ns)
	cmd.Env = append(cmd.Env, built...)
	if err := startInNamespace(ns, cmd); err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
		return 1
	}
	// Forward interrupts so the child can run its cleanups.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	signal.Stop(sigs)
	if ee, ok := err.(*exec.ExitError); ok {
		if code := ee.ExitCode(); code > 0 {
			return code
		}
		return 1 // killed by a signal
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
		return 1
	}
	return 0
}

// prebuildFor builds what the run needs (a run of control planes only:
// hwdra alone) and returns the child's environment naming it.
func prebuildFor(root string) []string {
	if ControlPlaneOnlyRun() {
		return prebuildHwdra(root)
	}
	return prebuild(root)
}

// prebuild compiles the images, the hwdra binary, the agent's image and
// the helm CLI before entering the namespace, where the go command could
// not reach the module proxy. It
// returns environment for the child; failures are left for the child to
// report in the tests that need the result. With EnvSharedBuild set, two
// runs side by side (hack/e2e-realnode.sh) build once: the first into
// that directory, under its lock; the second takes what it built.
func prebuild(root string) []string {
	shared := os.Getenv(EnvSharedBuild)
	if shared == "" {
		return buildAll(root)
	}
	if err := os.Symlink(filepath.Join(shared, "images"), filepath.Join(root, "images")); err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
		return buildAll(root)
	}
	unlock, err := flockFile(filepath.Join(shared, "lock"), "the build beside")
	if err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
		return buildAll(root)
	}
	defer unlock()
	envFile := filepath.Join(shared, "env")
	if data, err := os.ReadFile(envFile); err == nil {
		fmt.Fprintf(os.Stderr, "hwdra e2e: images and hwdra built by the run beside (%s)\n", shared)
		return strings.Fields(string(data))
	}
	env := buildAll(shared)
	if err := os.WriteFile(envFile, []byte(strings.Join(env, "\n")), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", err)
	}
	return env
}

// buildAll is prebuild's work, into dir.
func buildAll(root string) []string {
	began := time.Now()
	defer func() {
		fmt.Fprintf(os.Stderr, "hwdra e2e: images and hwdra built in %v\n", time.Since(began).Round(time.Millisecond))
	}()
	var env []string
	imagesDone := make(chan struct{})
	go func() { // independent of the hwdra build: overlap them
		defer close(imagesDone)
		if _, err := buildImages(filepath.Join(root, "images")); err != nil {
			fmt.Fprintln(os.Stderr, "hwdra e2e: building images:", err)
		}
	}()
	agentDone := make(chan []string)
	go func() { // the agent's image and the helm CLI
		var env []string
		if archives, err := buildAgentImages(filepath.Join(root, "agent-image")); err != nil {
			fmt.Fprintln(os.Stderr, "hwdra e2e: building the agent image:", err)
		} else {
			env = append(env, envAgentImages+"="+strings.Join(archives, ","))
		}
		if helm, err := buildHelm(); err != nil {
			fmt.Fprintln(os.Stderr, "hwdra e2e: building helm:", err)
		} else {
			env = append(env, envHelm+"="+helm)
		}
		agentDone <- env
	}()
	defer func() { <-imagesDone }()
	env = append(env, prebuildHwdra(root)...)
	return append(env, <-agentDone...)
}

// prebuildHwdra builds ./cmd/hwdra unless HWDRA_BIN names one, and returns
// the child's environment naming it.
func prebuildHwdra(root string) []string {
	if os.Getenv(EnvHwdra) != "" {
		return nil
	}
	if path, err := buildHwdra(root); err == nil && path != "" {
		return []string{EnvHwdra + "=" + path}
	}
	return nil
}

// createNamespace makes the named network namespace with loopback up and a
// bridge that holds the node IP (the kubelet refuses a loopback node IP).
func createNamespace(ns string) error {
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", bridgeName, "type", "bridge"},
		{"-n", ns, "addr", "add", NodeIP + "/24", "dev", bridgeName},
		{"-n", ns, "link", "set", bridgeName, "up"},
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}

// startInNamespace starts cmd inside the namespace through nsenter
// (util-linux), which switches only the network namespace: mounts, cgroups
// and /sys stay the host's, as the kubelet needs them.
func startInNamespace(ns string, cmd *exec.Cmd) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("nsenter (util-linux) missing: %w", err)
	}
	cmd.Args = append([]string{nsenter, "--net=/run/netns/" + ns, "--"}, cmd.Args...)
	cmd.Path = nsenter
	return cmd.Start()
}

// lockMachine takes a machine-wide lock for the run, waiting for another
// run to finish.
func lockMachine() (func(), error) {
	return flockFile(filepath.Join(os.TempDir(), "hwdra-e2e.lock"), "another real-node run")
}

// flockFile takes an exclusive lock on path, waiting for holder.
func flockFile(path, holder string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		fmt.Fprintln(os.Stderr, "hwdra e2e:", holder, "holds", path, "- waiting for it")
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	return func() { f.Close() }, nil
}
