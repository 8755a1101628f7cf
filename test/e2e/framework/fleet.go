// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/retry"
)

// SchedulerMetricsURL is where the scheduler of a ControlPlaneOnly node
// serves /metrics (inside the run's namespace).
const SchedulerMetricsURL = "https://127.0.0.1:10259/metrics"

// fleetControllerManagerArgs turns the node lifecycle controller off: the
// fleet's Nodes have no kubelet to renew their Leases, and the controller
// would taint them unreachable within a minute.
func fleetControllerManagerArgs(args []string) []string {
	return append(args, "--controllers=*,-nodelifecycle")
}

// fleetSchedulerArgs serve the scheduler's metrics on loopback without
// authentication and lift its client's rate limit (50 QPS by default, two
// writes per DRA pod) as upstream scheduler_perf does, so throughput is
// the scheduler's, not its rate limiter's. With
// Options.PercentageOfNodesToScore the scheduler reads a configuration
// file instead of its deprecated flags (kubeconfig, leader election, QPS).
func (n *Node) fleetSchedulerArgs(args []string, kubeconfig string) ([]string, error) {
	out := make([]string, 0, len(args)+5)
	pct := n.Options.PercentageOfNodesToScore
	allow := "/healthz,/readyz,/livez,/metrics"
	if n.Options.SchedulerProfiling {
		allow += ",/debug/pprof/*"
	}
	for _, a := range args {
		switch {
		case a == "--secure-port=0":
		case a == "--profiling=false" && n.Options.SchedulerProfiling:
			out = append(out, "--profiling=true")
		case pct > 0 && (strings.HasPrefix(a, "--kubeconfig=") || strings.HasPrefix(a, "--leader-elect=")):
		default:
			out = append(out, a)
		}
	}
	out = append(out, "--secure-port=10259", "--bind-address=127.0.0.1",
		"--authorization-always-allow-paths="+allow)
	if pct <= 0 {
		return append(out, "--kube-api-qps=5000", "--kube-api-burst=5000"), nil
	}
	config := filepath.Join(n.Root, "scheduler-config.yaml")
	yaml := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
  qps: 5000
  burst: 5000
leaderElection:
  leaderElect: false
percentageOfNodesToScore: %d
`, kubeconfig, pct)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	return append(out, "--config="+config), nil
}

// bootControlPlane is boot for ControlPlaneOnly: the control plane and
// the admin client, nothing of the node.
func (n *Node) bootControlPlane(ctx context.Context) error {
	if err := n.startControlPlane(ctx); err != nil {
		return err
	}
	var err error
	n.AdminConfig, n.Admin, err = n.clientFromKubeconfig(n.kubeconfigs["admin"])
	return err
}

// StartScheduler starts a deferred scheduler (Options.DeferScheduler) and
// returns once it serves its metrics.
func (n *Node) StartScheduler(ctx context.Context) error {
	if err := n.Scheduler.Start(); err != nil {
		return err
	}
	if !n.Options.ControlPlaneOnly {
		return nil
	}
	url := strings.TrimSuffix(SchedulerMetricsURL, "/metrics") + "/healthz"
	if err := waitHTTP(ctx, url, insecureLoopback(), 30*time.Second); err != nil {
		return fmt.Errorf("kube-scheduler: %w\n%s", err, n.Scheduler.Tail(20))
	}
	return nil
}

// insecureLoopback reaches the scheduler's self-signed port on loopback.
func insecureLoopback() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback in the run's namespace
	}}
}

// SchedulerCPUProfile writes a CPU profile of the scheduler over the
// next seconds to w (ControlPlaneOnly with SchedulerProfiling).
func SchedulerCPUProfile(ctx context.Context, seconds int, w io.Writer) error {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(SchedulerMetricsURL, "/metrics"), seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	c := insecureLoopback()
	c.Timeout = time.Duration(seconds+30) * time.Second
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("scheduler /debug/pprof/profile: %s: %s", resp.Status, body)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// SchedulerMetrics is the scheduler's /metrics text (ControlPlaneOnly).
func SchedulerMetrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, SchedulerMetricsURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := insecureLoopback().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("scheduler /metrics: %s: %s", resp.Status, body)
	}
	return string(body), err
}

// APIServerMetrics is the API server's /metrics text.
func (n *Node) APIServerMetrics(ctx context.Context) (string, error) {
	body, err := n.Admin.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(body), err
}

// MetricSum adds the samples of a Prometheus text exposition whose name is
// name and whose labels include every label=value of match.
func MetricSum(text, name string, match ...string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		labels := rest[:i]
		all := true
		for _, m := range match {
			k, v, _ := strings.Cut(m, "=")
			all = all && strings.Contains(labels, k+`="`+v+`"`)
		}
		if v, err := strconv.ParseFloat(rest[i+1:], 64); all && err == nil {
			sum += v
		}
	}
	return sum
}

// CPUTime is the process's user plus system CPU time so far, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func (p *Process) CPUTime() (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(data), ')') // the command may hold spaces
	f := strings.Fields(string(data[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("%s: unreadable stat %q", p.Name, data)
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: stat: %w", p.Name, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// FastAdmin is an admin client without a client-side rate limit, for
// writing a fleet's objects.
func (n *Node) FastAdmin() (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(n.AdminConfig)
	cfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	return kubernetes.NewForConfig(cfg)
}

// SimulatedNode is a Node no kubelet runs: Ready, with room for any pod
// the scheduler's other plugins check, so that only DRA decides.
func SimulatedNode(name string) *corev1.Node {
	room := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("224"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{
			Capacity: room, Allocatable: room,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
		},
	}
}

// RegisterNode creates a SimulatedNode, takes off the not-ready taint the
// TaintNodesByCondition admission puts on every new Node (the node
// lifecycle controller, which would, is off), and writes its status. The
// controller-manager writes Nodes too (the TTL annotation): each write
// retries on conflict.
func RegisterNode(ctx context.Context, cs kubernetes.Interface, name string) error {
	want := SimulatedNode(name)
	if _, err := cs.CoreV1().Nodes().Create(ctx, want, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	nodes := cs.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Spec.Taints = nil
		if got, err = nodes.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			return err
		}
		got.Status = want.Status
		_, err = nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	return nil
}
