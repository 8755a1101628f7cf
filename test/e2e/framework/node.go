// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options change how a node is started. The zero value is the cluster hwdra
// targets.
type Options struct {
	// Name is the node name; default "node-1".
	Name string
	// FeatureGates override DefaultFeatureGates (e.g. one gate off) in every
	// component.
	FeatureGates map[string]bool
	// SkipDeploy leaves the chart (deploy/helm/hwdra) uninstalled.
	SkipDeploy bool
	// ControlPlaneOnly starts etcd, the API server, the controller-manager
	// (without the node lifecycle controller: no kubelet keeps a Lease)
	// and the scheduler (its metrics on SchedulerMetricsURL), and nothing
	// of the node: no containerd, kubelet or chart. For simulated fleets
	// whose Node objects the test writes (fleet.go).
	ControlPlaneOnly bool
	// DeferScheduler leaves the scheduler stopped until StartScheduler,
	// so a test measures scheduling alone, not its pods' creation.
	DeferScheduler bool
	// Workers makes this the control plane of a cluster (cluster.go):
	// the API server reachable from the workers' namespaces, a kubelet
	// identity per worker name, the node lifecycle controller on.
	Workers []string
	// SchedulerBinary runs this kube-scheduler instead of the built one
	// (ControlPlaneOnly: the fleet's patched scheduler).
	SchedulerBinary string
	// PercentageOfNodesToScore sets the scheduler's option of that name
	// (ControlPlaneOnly; 0: the scheduler's default).
	PercentageOfNodesToScore int
	// SchedulerProfiling serves the scheduler's /debug/pprof on its
	// port (ControlPlaneOnly; SchedulerCPUProfile reads it).
	SchedulerProfiling bool
}

// Node is a running single-node cluster.
type Node struct {
	Name    string
	Root    string // everything the node writes lives here
	CDIDir  string // containerd's CDI spec directory = the agent's --cdi-dir
	Options Options

	NRISocket string

	Admin       *kubernetes.Clientset
	AdminConfig *rest.Config

	Etcd, APIServer, ControllerManager, Scheduler, Containerd, Kubelet *Process

	// StartupTime is how long Start took, from nothing to a Ready node with
	// images imported and the chart installed.
	StartupTime time.Duration

	pki         *pki
	kubeconfigs map[string]string
	procs       []*Process
	stopOnce    sync.Once

	// A cluster's worker (cluster.go) runs in its own network and mount
	// namespaces, an isolated node (isolated.go) in its own mount
	// namespace; see worker.
	worker  *worker
	profile string // a worker's built-in mock profile
}

// AdminKubeconfig is the path of a kubeconfig with the cluster admin's
// credentials.
func (n *Node) AdminKubeconfig() string { return n.kubeconfigs["admin"] }

var (
	nodeSeq    int
	sharedMu   sync.Mutex
	sharedNode *Node
)

// SkipIfUnavailable skips t when this run cannot start a node.
func SkipIfUnavailable(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip("real-node test skipped: " + skipReason)
	}
	if os.Getenv(envChild) == "" {
		t.Skip("real-node test skipped: TestMain must call framework.Main")
	}
}

// skipIfControlPlaneOnly skips t in a run that starts control planes only
// (ControlPlaneOnlyRun), which takes no machine lock: a node would collide
// with another run's kubelet.
func skipIfControlPlaneOnly(t testing.TB, opts Options) {
	t.Helper()
	if ControlPlaneOnlyRun() && !opts.ControlPlaneOnly {
		t.Skipf("real-node test skipped: %s=1 starts control planes only", EnvControlPlaneOnly)
	}
}

// Shared returns the suite's node with default options, starting it on first
// use; it stops when the suite ends. Tests that use it leave it as they found
// it (their own namespaces, their own agents).
func Shared(t testing.TB) *Node {
	t.Helper()
	SkipIfUnavailable(t)
	skipIfControlPlaneOnly(t, Options{})
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedNode == nil {
		n, err := start(Options{})
		if err != nil {
			t.Fatalf("start node: %v", err)
		}
		sharedNode = n
	}
	n := sharedNode
	t.Cleanup(func() { n.dumpIfFailed(t) })
	return n
}

// New starts a node of its own for t, stopped when t ends. Only one node
// runs at a time in a run (they share the namespace, ports and, outside
// a run of isolated nodes, the kubelet's fixed paths), so the shared node
// is stopped first and restarted on next use.
func New(t testing.TB, opts Options) *Node {
	t.Helper()
	SkipIfUnavailable(t)
	skipIfControlPlaneOnly(t, opts)
	stopShared()
	n, err := start(opts)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		n.dumpIfFailed(t)
		n.Stop()
	})
	return n
}

func stopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedNode != nil {
		sharedNode.Stop()
		sharedNode = nil
	}
}

func start(opts Options) (*Node, error) {
	began := time.Now()
	if opts.Name == "" {
		opts.Name = "node-1"
	}
	gates := DefaultFeatureGates()
	maps.Copy(gates, opts.FeatureGates)
	if err := dropUnknownGates(gates); err != nil {
		return nil, err
	}
	opts.FeatureGates = gates

	runRoot := os.Getenv(envRoot)
	nodeSeq++
	root := filepath.Join(runRoot, "n"+strconv.Itoa(nodeSeq))
	n := &Node{
		Name: opts.Name, Root: root, Options: opts,
		CDIDir:    filepath.Join(root, "cdi"),
		NRISocket: filepath.Join(root, "nri", "nri.sock"),
	}
	if IsolatedRun() && !opts.ControlPlaneOnly {
		n.worker = isolatedWorker(root)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := n.boot(ctx, filepath.Join(runRoot, "images")); err != nil {
		n.Stop()
		return nil, err
	}
	n.StartupTime = time.Since(began)
	fmt.Fprintf(os.Stderr, "hwdra e2e: node %s up in %v (root %s)\n", n.Name, n.StartupTime.Round(time.Millisecond), n.Root)
	return n, nil
}

// boot brings the pieces up, overlapping what does not depend on each other:
// images build while the control plane starts; containerd starts with it.
func (n *Node) boot(ctx context.Context, imageDir string) error {
	if err := os.MkdirAll(n.Root, 0o755); err != nil {
		return err
	}
	if n.Options.ControlPlaneOnly {
		return n.bootControlPlane(ctx)
	}
	if err := makeShared(n.Root); err != nil {
		return err
	}
	if n.worker != nil {
		if err := n.isolate(); err != nil {
			return err
		}
	}
	type result struct {
		archives []string
		err      error
	}
	imagesCh := make(chan result, 1)
	go func() {
		a, err := buildImages(imageDir)
		imagesCh <- result{a, err}
	}()
	if err := n.startControlPlane(ctx); err != nil {
		return err
	}
	var err error
	if n.AdminConfig, n.Admin, err = n.clientFromKubeconfig(n.kubeconfigs["admin"]); err != nil {
		return err
	}
	img := <-imagesCh
	if img.err != nil {
		return img.err
	}
	// The agent's image is not imported: the chart's install pulls it
	// from the suite's registry (registry.go).
	archives := img.archives
	if err := n.startContainerd(ctx, archives); err != nil {
		return err
	}
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	if !n.Options.SkipDeploy {
		if err := n.ApplyDeploy(ctx); err != nil {
			return err
		}
	}
	if err := n.WaitNodeReady(ctx, 90*time.Second); err != nil {
		return err
	}
	if !n.Options.SkipDeploy {
		return n.waitDeployEffective(ctx, 30*time.Second)
	}
	return nil
}

func (n *Node) newProcess(name, path string, args ...string) *Process {
	p := &Process{Name: name, Path: path, Args: args, LogPath: filepath.Join(n.Root, "logs", name+".log")}
	if n.worker != nil {
		n.worker.enter(p)
	}
	n.procs = append(n.procs, p)
	return p
}

// Stop tears the node down completely: agents, kubelet, every sandbox
// (through CRI: pods outlive the kubelet), containerd and its shims, the
// kubepods cgroups, mounts under the root (deepest first), the control
// plane, and the root itself. Safe to call twice.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		began := time.Now()
		defer func() {
			fmt.Fprintf(os.Stderr, "hwdra e2e: node %s stopped in %v\n", n.Name, time.Since(began).Round(time.Millisecond))
		}()
		log := func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "hwdra e2e: stop %s: "+format+"\n", append([]any{n.Name}, args...)...)
		}
		for _, p := range n.procs {
			if p.Name != "kube-apiserver" && p.Name != "etcd" && p.Name != "containerd" &&
				p.Name != "kube-controller-manager" && p.Name != "kube-scheduler" {
				p.Stop(5 * time.Second) // agents and the kubelet first
			}
		}
		if n.Containerd != nil && n.Containerd.Running() {
			if err := removeAllSandboxes(n.ContainerdSocket(), 20*time.Second); err != nil {
				log("removing sandboxes: %v", err)
			}
			n.Containerd.Stop(5 * time.Second)
		}
		for _, p := range []*Process{n.Scheduler, n.ControllerManager, n.APIServer, n.Etcd} {
			if p != nil {
				p.Stop(5 * time.Second)
			}
		}
		// Whatever still runs with a path under the root (shims whose
		// sandbox could not be removed) has no owner left.
		if n.worker != nil {
			n.stopWorker(log)
		} else {
			killByCommandLine(n.Root, log)
		}
		if !n.Options.ControlPlaneOnly && n.worker == nil { // no pods; another run's may be there
			cleanupCgroups(log, machineKubepods)
		}
		unmountUnder(n.Root, log)
		n.saveLogs()
		if os.Getenv(EnvKeep) == "" {
			if err := os.RemoveAll(n.Root); err != nil {
				log("remove root: %v", err)
			}
		}
	})
}

// saveLogs copies every component's log to $HWDRA_E2E_ARTIFACTS/<node>-<seq>.
func (n *Node) saveLogs() {
	dst := os.Getenv(EnvArtifacts)
	if dst == "" {
		return
	}
	dir := filepath.Join(dst, n.Name+"-"+filepath.Base(n.Root))
	_ = os.MkdirAll(dir, 0o755)
	logs, _ := filepath.Glob(filepath.Join(n.Root, "logs", "*.log"))
	for _, l := range logs {
		if data, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(l)), data, 0o644)
		}
	}
}

// dumpIfFailed shows the end of every component's log in a failed test.
func (n *Node) dumpIfFailed(t testing.TB) {
	if !t.Failed() {
		return
	}
	for _, p := range n.procs {
		t.Logf("---- %s (last 25 lines of %s)\n%s", p.Name, p.LogPath, p.Tail(25))
	}
}

// makeShared makes dir a shared mount, as / is on a systemd node: the
// agent pod's HostToContainer mounts (pods' network namespaces, the
// driver root) need their source on a shared or slave mount, and this
// machine's / may be private. Teardown unmounts it with everything under
// the root.
func makeShared(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind mount %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}
