// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// A cluster is one control plane and worker nodes on this machine. Each
// worker has its own kubelet, containerd and mock hardware, and runs in
// network and mount namespaces of its own:
//
//   - network: a veth on the run's bridge gives it an address beside
//     NodeIP (where the API server and the registry listen); its pods get
//     addresses from a subnet of its own on a bridge of its own, and its
//     host-network pods (the agent) see only its links (the mock's VF
//     stand-ins);
//   - mount: the DaemonSet's host paths are the same strings on every
//     node, so each worker's directory is mounted at one shared path
//     (workerRoot) that only its own processes see, and so is its own
//     device-plugin directory at the kubelet's fixed
//     /var/lib/kubelet/device-plugins (every kubelet empties it when it
//     starts). The tests see a worker's files under its Root as usual;
//     mounts made there (the mock's tmpfs) propagate into the worker.
//
// Each worker's kubelet has a cgroup root of its own: a kubelet removes
// the pod cgroups under its root that it does not know.

// WorkerSpec is one worker of a cluster: its node name and the built-in
// mock profile its agent runs on.
type WorkerSpec struct {
	Name    string
	Profile string
}

// Cluster is a running multi-node cluster. Its Node is the control
// plane (clients, helm, the chart); each worker is a Node whose clients
// are the control plane's.
type Cluster struct {
	*Node
	Workers []*Node
}

// workerCgroupPrefix names the workers' cgroup roots (the sweep finds
// them by it).
const workerCgroupPrefix = "hwe2e-"

// workerBridge is the bridge the CNI plugin makes for pods in a worker's
// namespace.
const workerBridge = "hwpods0"

// worker is what a cluster's worker, or an isolated node (isolated.go),
// has beyond a node in the machine's namespaces. An isolated node has no
// netns and no nodeRoot: it is in its run's network namespace, and its
// processes see its Root where the tests do.
type worker struct {
	index    int    // 1, 2, ...: its addresses
	netns    string // its network namespace
	nodeRoot string // where its processes see its Root
	cgroup   string // its kubelet's cgroupRoot
	holder   *exec.Cmd
	mocked   bool // its mock hardware's profile and tmpfs are in place
}

// ownNetwork says whether n is a cluster's worker, in a network
// namespace of its own.
func (n *Node) ownNetwork() bool { return n.worker != nil && n.worker.netns != "" }

// IP is the node's address: its kubelet's and its host-network pods'.
func (n *Node) IP() string {
	if n.ownNetwork() {
		return fmt.Sprintf("10.200.0.%d", 20+n.worker.index)
	}
	return NodeIP
}

func (w *worker) podCIDR() string { return fmt.Sprintf("10.201.%d.0/24", w.index) }

// onNode is path as the node's own processes see it: the same but on a
// cluster's worker, whose Root they see at nodeRoot.
func (n *Node) onNode(path string) string {
	if n.worker == nil || n.worker.nodeRoot == "" {
		return path
	}
	rel, err := filepath.Rel(n.Root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return path
	}
	return filepath.Join(n.worker.nodeRoot, rel)
}

// enter makes p start inside the worker's namespaces. nsenter without
// --pid execs in place, so p's PID is the component's.
func (w *worker) enter(p *Process) {
	args := []string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", w.holder.Process.Pid), "--", p.Path}
	if w.netns != "" {
		args = append([]string{"--net=/run/netns/" + w.netns}, args...)
	}
	p.Args = append(args, p.Args...)
	p.Path = "nsenter"
}

// clusterControllerManagerArgs notice a lost node within seconds, not
// the production 50 s, so the lost-node scenario runs in CI's time.
func clusterControllerManagerArgs(args []string) []string {
	return append(args, "--node-monitor-period=2s", "--node-monitor-grace-period=16s")
}

// NewCluster starts a control plane and the workers, stopped when t
// ends. Like New, it stops the shared node first: one cluster or node
// runs at a time.
func NewCluster(t testing.TB, workers ...WorkerSpec) *Cluster {
	t.Helper()
	SkipIfUnavailable(t)
	if ControlPlaneOnlyRun() {
		t.Skipf("real-node test skipped: %s=1 starts control planes only", EnvControlPlaneOnly)
	}
	stopShared()
	began := time.Now()
	var names []string
	for _, w := range workers {
		names = append(names, w.Name)
	}
	cp, err := start(Options{Name: "control-plane", ControlPlaneOnly: true, Workers: names})
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	c := &Cluster{Node: cp}
	t.Cleanup(func() {
		if t.Failed() {
			for _, w := range c.Workers {
				w.dumpIfFailed(t)
			}
		}
		c.Stop()
	})
	images, err := buildImages(filepath.Join(os.Getenv(envRoot), "images"))
	if err != nil {
		t.Fatal(err)
	}
	for i, spec := range workers {
		c.Workers = append(c.Workers, c.newWorker(spec, i+1))
	}
	errs := make(chan error, len(c.Workers))
	for _, w := range c.Workers {
		go func() { errs <- w.bootWorker(images) }()
	}
	for range c.Workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, w := range c.Workers {
		if err := w.WaitNodeReady(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	c.StartupTime = time.Since(began)
	Timing(t, fmt.Sprintf("cluster of %d workers up", len(workers)), c.StartupTime)
	return c
}

// newWorker is the worker's Node, not started.
func (c *Cluster) newWorker(spec WorkerSpec, index int) *Node {
	runRoot := os.Getenv(envRoot)
	nodeSeq++
	root := filepath.Join(runRoot, "n"+strconv.Itoa(nodeSeq))
	n := &Node{
		Name: spec.Name, Root: root,
		CDIDir:    filepath.Join(root, "cdi"),
		NRISocket: filepath.Join(root, "nri", "nri.sock"),
		Options:   Options{Name: spec.Name, FeatureGates: c.Options.FeatureGates},
		Admin:     c.Admin, AdminConfig: c.AdminConfig,
		kubeconfigs: map[string]string{
			"admin":   c.kubeconfigs["admin"],
			"kubelet": c.kubeconfigs["kubelet-"+spec.Name],
		},
		pki: c.pki,
		worker: &worker{
			index:    index,
			netns:    os.Getenv(envNetns) + "-" + spec.Name,
			nodeRoot: filepath.Join(runRoot, "node"),
			cgroup:   workerCgroupPrefix + strings.TrimPrefix(os.Getenv(envNetns), "hwdra-e2e-") + "-" + spec.Name,
		},
		profile: spec.Profile,
	}
	return n
}

// bootWorker brings a worker up: namespaces, cgroup root, containerd
// with the test images, kubelet. The agent comes from the chart's
// DaemonSet (InstallAgents).
func (n *Node) bootWorker(images []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	began := time.Now()
	for _, dir := range []string{n.Root, n.worker.nodeRoot, DevicePluginDir, filepath.Join(n.Root, "device-plugins")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := makeShared(n.Root); err != nil {
		return err
	}
	if err := n.worker.network(); err != nil {
		return fmt.Errorf("worker %s: %w", n.Name, err)
	}
	if err := n.worker.makeCgroup(); err != nil {
		return fmt.Errorf("worker %s: %w", n.Name, err)
	}
	if err := n.worker.startHolder(n.Root, workerHolderScript); err != nil {
		return fmt.Errorf("worker %s: %w", n.Name, err)
	}
	if err := n.startContainerd(ctx, images); err != nil {
		return fmt.Errorf("worker %s: %w", n.Name, err)
	}
	if err := n.startKubelet(ctx); err != nil {
		return fmt.Errorf("worker %s: %w", n.Name, err)
	}
	fmt.Fprintf(os.Stderr, "hwdra e2e: worker %s (%s) up in %v (root %s)\n", n.Name, n.IP(), time.Since(began).Round(time.Millisecond), n.Root)
	return nil
}

// network makes the worker's network namespace: loopback, and eth0 with
// its address, the other end of its veth on the run's bridge.
func (w *worker) network() error {
	ip := fmt.Sprintf("10.200.0.%d/24", 20+w.index)
	host := fmt.Sprintf("hwv%d", w.index)
	steps := [][]string{
		{"netns", "add", w.netns},
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", w.netns},
		{"link", "set", host, "master", bridgeName, "up"},
		{"-n", w.netns, "link", "set", "lo", "up"},
		{"-n", w.netns, "addr", "add", ip, "dev", "eth0"},
		{"-n", w.netns, "link", "set", "eth0", "up"},
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	return nil
}

// makeCgroup creates the kubelet's cgroup root in every hierarchy (it
// refuses a root that does not exist). cgroup v1's cpuset needs its CPUs
// and memory nodes before anything can join a child.
func (w *worker) makeCgroup() error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		hierarchies = append(hierarchies, "/sys/fs/cgroup/cgroup.procs") // unified only
	}
	for _, procs := range hierarchies {
		parent := filepath.Dir(procs)
		dir := filepath.Join(parent, w.cgroup)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if data, err := os.ReadFile(filepath.Join(parent, f)); err == nil && filepath.Base(parent) == "cpuset" {
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
				}
			}
		}
		if data, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control")); err == nil {
			var enable []string
			for _, c := range strings.Fields(string(data)) {
				enable = append(enable, "+"+c)
			}
			if len(enable) > 0 {
				_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644)
			}
		}
	}
	return nil
}

// cgroupDirs lists the worker's cgroup root in every hierarchy.
func (w *worker) cgroupDirs() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + w.cgroup)
	if d := "/sys/fs/cgroup/" + w.cgroup; dirExists(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// workerHolderScript makes a worker's mount namespace: Root at
// nodeRoot, shared (the agent pod's HostToContainer mounts need it), and
// its own device-plugin directory ($1 Root, $2 nodeRoot, $3
// DevicePluginDir).
const workerHolderScript = `mount --bind "$1" "$2" && mount --make-rshared "$2" &&
mount --bind "$1/device-plugins" "$3" && echo ready && exec sleep infinity`

// startHolder starts the process that holds the worker's mount
// namespace, slave to the machine's (mounts the tests make under Root
// reach it), made by script.
func (w *worker) startHolder(root, script string) error {
	cmd := exec.Command("unshare", "--mount", "--propagation", "slave", "--",
		"sh", "-c", script, "holder", root, w.nodeRoot, DevicePluginDir)
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	w.holder = cmd
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			return fmt.Errorf("mount namespace: %s", stderr.String())
		}
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("mount namespace not ready after 10s: %s", stderr.String())
	}
}

// stopWorker is the end of Stop for a worker: what runs in its network
// namespace and its cgroup root, then the holder of its mount namespace,
// its network namespace and its cgroup root.
func (n *Node) stopWorker(log logf) {
	w := n.worker
	if w.netns != "" {
		killInNamespace(w.netns, log)
	} else { // an isolated node: its run's namespace holds the tests too
		killByCommandLine(n.Root, log)
	}
	cleanupCgroups(log, w.cgroupDirs)
	if w.holder != nil && w.holder.Process != nil {
		_ = w.holder.Process.Kill()
		_ = w.holder.Wait()
	}
	if w.netns != "" {
		if out, err := exec.Command("ip", "netns", "delete", w.netns).CombinedOutput(); err != nil {
			log("ip netns delete %s: %v: %s", w.netns, err, out)
		}
	}
	for _, d := range w.cgroupDirs() {
		if err := unix.Rmdir(d); err != nil {
			log("remove cgroup %s: %v", d, err)
		}
	}
}

// Stop stops the workers (together) and then the control plane.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, w := range c.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.Stop() }()
	}
	wg.Wait()
	c.Node.Stop()
}

// Worker returns the worker named name.
func (c *Cluster) Worker(name string) *Node {
	for _, w := range c.Workers {
		if w.Name == name {
			return w
		}
	}
	panic("no worker " + name)
}

// MockDir is where a worker's mock hardware keeps its state (a tmpfs),
// as the tests see it; the agent's HWDRA_MOCK_DIR is the same place on
// the node.
func (n *Node) WorkerMockDir() string {
	return filepath.Join(n.AgentPodStateDir(), "mock", "hw")
}

// AgentValues are the chart's values for every worker: the paths each
// worker sees at the same place, its hardware from a profile file in its
// state directory (its own mock profile), the mock's state in a tmpfs
// beside it.
func (c *Cluster) AgentValues(t testing.TB) map[string]any {
	t.Helper()
	w0 := c.Workers[0]
	profile := filepath.Join(w0.AgentPodStateDir(), "profile.yaml")
	values := w0.AgentValues("mock:" + w0.onNode(profile))
	for _, w := range c.Workers {
		if err := w.prepareMockHardware(t); err != nil {
			t.Fatalf("worker %s: %v", w.Name, err)
		}
	}
	values["extraEnv"] = append(values["extraEnv"].([]any),
		map[string]any{"name": persist.DirEnv, "value": w0.onNode(w0.WorkerMockDir())})
	return values
}

// prepareMockHardware writes the worker's profile (built in, by name)
// and mounts a tmpfs for the mock's state, once: unmounted when t ends
// (after the agents are gone: registered before InstallAgents).
func (n *Node) prepareMockHardware(t testing.TB) error {
	if n.worker.mocked {
		return nil
	}
	n.worker.mocked = true
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, "internal", "mock", "profile", "profiles", n.profile+".yaml"))
	if err != nil {
		return err
	}
	dir := n.AgentPodStateDir()
	if err := os.MkdirAll(filepath.Join(dir, "mock"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "profile.yaml"), data, 0o644); err != nil {
		return err
	}
	mnt := filepath.Join(dir, "mock")
	if unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=512m,mode=0755") == nil {
		t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	}
	return nil
}

// InstallAgents installs the chart with values (AgentValues), labels
// every worker for its DaemonSet and waits until an agent is ready on
// each. When t ends the agents are taken off and the slices deleted.
func (c *Cluster) InstallAgents(t testing.TB, values map[string]any) {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		for _, w := range c.Workers {
			_ = w.labelNode(context.Background(), AgentPodLabel, "")
		}
		if err := c.WaitAgents(context.Background(), 0, 90*time.Second); err != nil {
			t.Errorf("stopping the agents: %v", err)
		}
		for _, w := range c.Workers {
			w.DeleteResourceSlices(context.Background())
		}
	})
	if err := c.UpgradeAgents(ctx, values, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// LabelForAgent labels the worker for the agent's DaemonSet, as an
// operator's node labelling does for a node that registers anew.
func (c *Cluster) LabelForAgent(ctx context.Context, w *Node) error {
	return w.labelNode(ctx, AgentPodLabel, "true")
}

// UpgradeAgents installs or upgrades the chart with values, labels the
// workers and waits until the rollout is done on every one.
func (c *Cluster) UpgradeAgents(ctx context.Context, values map[string]any, timeout time.Duration) error {
	if err := c.InstallChart(ctx, values); err != nil {
		return err
	}
	for _, w := range c.Workers {
		if err := w.labelNode(ctx, AgentPodLabel, "true"); err != nil {
			return err
		}
	}
	return c.WaitAgents(ctx, len(c.Workers), timeout)
}

// WaitAgents waits until the DaemonSet has want agents, each of the
// current template and ready, and no other.
func (c *Cluster) WaitAgents(ctx context.Context, want int, timeout time.Duration) error {
	return waitfor.Check(ctx, fmt.Sprintf("the agent DaemonSet rolled out on %d nodes", want), timeout, func() error {
		ds, err := c.Admin.AppsV1().DaemonSets(AgentNamespace).Get(ctx, "hwdra-agent", metav1.GetOptions{})
		pods, perr := c.agentPods(ctx)
		switch {
		case err != nil && want == 0 && len(pods) == 0 && perr == nil:
			return nil // uninstalled
		case err != nil:
			return err
		}
		if last := rolloutState(ds, pods, perr, int32(want)); last != "" {
			return errors.New(last)
		}
		return nil
	})
}

// AgentPodOn is the agent pod on the worker.
func (c *Cluster) AgentPodOn(ctx context.Context, w *Node) (*corev1.Pod, error) {
	pods, err := c.agentPods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Spec.NodeName == w.Name && pods[i].DeletionTimestamp == nil {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("no agent pod on %s", w.Name)
}

// KillAgent SIGKILLs the worker's agent (the processes named hwdra in
// its network namespace, where the agent pod's host network is), as a
// node that loses power loses it.
func (n *Node) KillAgent(log logf) int {
	out, err := exec.Command("ip", "netns", "pids", n.worker.netns).Output()
	if err != nil {
		return 0
	}
	killed := 0
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "hwdra" {
			log("killing agent process %d on %s", pid, n.Name)
			if unix.Kill(pid, unix.SIGKILL) == nil {
				killed++
			}
		}
	}
	return killed
}
