// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// AgentPod is the agent as the chart runs it: the DaemonSet's pod on this
// node, with the chart's service account, RBAC and mounts.
type AgentPod struct {
	n    *Node
	Name string
	UID  types.UID
}

// AgentPodValues are AgentValues with hardware as the tests name it: a
// built-in profile ("mock:dgx-h100") as it is, a profile file
// (MockProfile) as the chart's mockProfile. Mock hardware lives in a
// fresh directory of the node's under the pod's state directory (a host
// path, persist.DirEnv; MockDirOf names it; a tmpfs as MockDir's),
// removed when t ends: the
// container runtime mounts the driver's files from there into GPU
// containers, and the hardware outlives the pod, as real hardware does.
func (n *Node) AgentPodValues(t testing.TB, hardware string) map[string]any {
	t.Helper()
	values := n.AgentValues(hardware)
	path, mock := strings.CutPrefix(hardware, "mock:")
	if mock && filepath.IsAbs(path) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		values["hardware"], values["mockProfile"] = "mock:", string(data)
	}
	if mock {
		// Registered before the pod starts, removed after it stopped.
		dir := mockDirUnder(t, n.AgentPodStateDir())
		values["extraEnv"] = append(values["extraEnv"].([]any), map[string]any{"name": persist.DirEnv, "value": dir})
	}
	return values
}

// MockDirOf is the mock hardware's directory of agent pod values
// (AgentPodValues); "" for none.
func MockDirOf(values map[string]any) string {
	env, _ := values["extraEnv"].([]any)
	for _, e := range env {
		if m, ok := e.(map[string]any); ok && m["name"] == persist.DirEnv {
			dir, _ := m["value"].(string)
			return dir
		}
	}
	return ""
}

// StartAgentPod installs the chart with values (AgentPodValues), lets its
// DaemonSet run on this node and waits until its pod is ready. When t
// ends (after the cleanups registered later, which may still need the
// agent) the node loses the label, the pod is gone, and the node's
// ResourceSlices are deleted.
func (n *Node) StartAgentPod(t testing.TB, values map[string]any) *AgentPod {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() {
		if err := n.StopAgentPod(context.Background(), 60*time.Second); err != nil {
			t.Errorf("stopping the agent pod: %v", err)
		}
		n.DeleteResourceSlices(context.Background())
	})
	began := time.Now()
	pod, err := n.UpgradeAgent(ctx, values, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("---- agent pod %s (last 60 lines)\n%s", pod.Name, pod.Tail(60))
		}
	})
	Timing(t, "agent pod ready", time.Since(began))
	return pod
}

// UpgradeAgent installs or upgrades the chart with values, labels the
// node for the DaemonSet, and waits until the rollout is done.
func (n *Node) UpgradeAgent(ctx context.Context, values map[string]any, timeout time.Duration) (*AgentPod, error) {
	if err := n.InstallChart(ctx, values); err != nil {
		return nil, err
	}
	if err := n.labelNode(ctx, AgentPodLabel, "true"); err != nil {
		return nil, err
	}
	return n.WaitAgentRollout(ctx, timeout)
}

// StopAgentPod takes the DaemonSet off the node and waits until its pod
// is gone (the agent stopped cleanly: SIGTERM).
func (n *Node) StopAgentPod(ctx context.Context, timeout time.Duration) error {
	if err := n.labelNode(ctx, AgentPodLabel, ""); err != nil {
		return err
	}
	return waitfor.Check(ctx, "the agent pods gone", timeout, func() error {
		pods, err := n.agentPods(ctx)
		if err == nil && len(pods) > 0 {
			err = fmt.Errorf("%d agent pods", len(pods))
		}
		return err
	})
}

func (n *Node) labelNode(ctx context.Context, key, value string) error {
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v)
	_, err := n.Admin.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

func (n *Node) agentPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := n.Admin.CoreV1().Pods(AgentNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=hwdra,app.kubernetes.io/component=node-agent",
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// WaitAgentRollout waits until the DaemonSet's rollout is done on this
// node: one agent pod, of the current template, ready, and no other (an
// older one deleted).
func (n *Node) WaitAgentRollout(ctx context.Context, timeout time.Duration) (*AgentPod, error) {
	var p *AgentPod
	err := waitfor.Check(ctx, "the agent DaemonSet rolled out", timeout, func() error {
		ds, err := n.Admin.AppsV1().DaemonSets(AgentNamespace).Get(ctx, "hwdra-agent", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pods, perr := n.agentPods(ctx)
		if last := rolloutState(ds, pods, perr, 1); last != "" {
			return errors.New(last)
		}
		p = &AgentPod{n: n, Name: pods[0].Name, UID: pods[0].UID}
		return nil
	})
	return p, err
}

// rolloutState says what a rollout onto want nodes still waits for, ""
// when done.
func rolloutState(ds *appsv1.DaemonSet, pods []corev1.Pod, err error, want int32) string {
	st := ds.Status
	switch {
	case err != nil:
		return err.Error()
	case st.ObservedGeneration < ds.Generation:
		return "the controller has not seen the new template"
	case st.DesiredNumberScheduled != want || st.UpdatedNumberScheduled != want || st.NumberAvailable != want:
		return fmt.Sprintf("desired %d, updated %d, available %d", st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberAvailable)
	case len(pods) != int(want):
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		sort.Strings(names)
		return fmt.Sprintf("%d agent pods: %v", len(pods), names)
	}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			return "agent pod " + p.Name + " is terminating"
		}
		if !PodReady(&p) {
			return "agent pod " + p.Name + " not ready"
		}
	}
	return ""
}

// PodReady says whether the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// LogPath is the agent container's log as the kubelet writes it (CRI
// format: each line prefixed with time and stream); its latest start.
func (p *AgentPod) LogPath() string {
	logs, _ := filepath.Glob(filepath.Join(p.n.Root, "pod-logs", AgentNamespace+"_"+p.Name+"_"+string(p.UID), "agent", "*.log"))
	sort.Strings(logs)
	if len(logs) == 0 {
		return ""
	}
	return logs[len(logs)-1]
}

// WaitLog waits until the agent's log has a line containing want.
func (p *AgentPod) WaitLog(ctx context.Context, want string, timeout time.Duration) error {
	return waitfor.Until(ctx, fmt.Sprintf("agent pod %s: %q in its log", p.Name, want), timeout, func() bool {
		data, err := os.ReadFile(p.LogPath())
		return err == nil && strings.Contains(string(data), want)
	})
}

// Log is the agent's log so far.
func (p *AgentPod) Log() string {
	data, _ := os.ReadFile(p.LogPath())
	return string(data)
}

// Tail is the last lines of the agent's log.
func (p *AgentPod) Tail(lines int) string {
	all := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Token is the service-account token the kubelet projected into the
// agent pod (what the agent authenticates with), read from the node.
func (p *AgentPod) Token() (string, error) {
	files, _ := filepath.Glob(filepath.Join(p.n.KubeletRoot(), "pods", string(p.UID), "volumes", "kubernetes.io~projected", "*", "token"))
	if len(files) != 1 {
		return "", fmt.Errorf("agent pod %s: %d projected tokens on the node, want 1", p.Name, len(files))
	}
	data, err := os.ReadFile(files[0])
	return strings.TrimSpace(string(data)), err
}

// Client is a client with the agent pod's own token.
func (p *AgentPod) Client() (*kubernetes.Clientset, error) {
	token, err := p.Token()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(p.n.Root, "cp", "agent-pod-"+string(p.UID)+".kubeconfig")
	if err := writeKubeconfig(path, "127.0.0.1", p.n.pki.CACert, token); err != nil {
		return nil, err
	}
	_, cs, err := p.n.clientFromKubeconfig(path)
	return cs, err
}

// Memory is the agent pod's memory as its cgroup (v1) accounts it and as
// the agent process (found through the cgroup) shows it, in bytes.
type Memory struct {
	// RSS is the cgroup's anonymous memory, MappedFile its mapped file
	// pages (only those first read by the pod: the binary's pages read
	// by the image import are charged elsewhere), Cache its page cache
	// (files it wrote: the mock's trees among them), Usage all of it.
	RSS, MappedFile, Cache, Usage int64
	// VmRSS, RssAnon and RssFile are the agent process's resident
	// memory, its anonymous part and its mapped files (the executable).
	VmRSS, RssAnon, RssFile int64
}

// Resident is the agent's resident memory: the process's VmRSS, which
// counts the mapped executable wherever its pages are charged.
func (m Memory) Resident() int64 { return m.VmRSS }

func (m Memory) String() string {
	mib := func(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
	return fmt.Sprintf("resident=%s (process VmRSS: anon %s, file %s); cgroup rss=%s mapped_file=%s cache=%s usage=%s",
		mib(m.Resident()), mib(m.RssAnon), mib(m.RssFile), mib(m.RSS), mib(m.MappedFile), mib(m.Cache), mib(m.Usage))
}

// Memory reads the pod's memory cgroup (kubepods/<qos>/pod<uid>, cgroup
// v1 with the cgroupfs driver, as this suite's kubelet runs) and its
// process's /proc status.
func (p *AgentPod) Memory() (Memory, error) {
	var m Memory
	kubepods := p.n.kubepodsDir("memory")
	dirs, _ := filepath.Glob(filepath.Join(kubepods, "*pod"+string(p.UID)))
	more, _ := filepath.Glob(filepath.Join(kubepods, "*", "pod"+string(p.UID)))
	dirs = append(dirs, more...)
	if len(dirs) != 1 {
		return m, fmt.Errorf("agent pod %s: %d memory cgroups found", p.Name, len(dirs))
	}
	stat, err := os.ReadFile(filepath.Join(dirs[0], "memory.stat"))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(stat), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "total_rss":
			m.RSS = n
		case "total_mapped_file":
			m.MappedFile = n
		case "total_cache":
			m.Cache = n
		}
	}
	usage, err := os.ReadFile(filepath.Join(dirs[0], "memory.usage_in_bytes"))
	if err != nil {
		return m, err
	}
	m.Usage, _ = strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64)
	// The agent: the pod's process that is not the sandbox's pause.
	procs, _ := filepath.Glob(filepath.Join(dirs[0], "*", "cgroup.procs"))
	for _, f := range procs {
		data, _ := os.ReadFile(f)
		for _, pid := range strings.Fields(string(data)) {
			exe, _ := os.Readlink("/proc/" + pid + "/exe")
			if filepath.Base(exe) != "hwdra" {
				continue
			}
			status, err := os.ReadFile("/proc/" + pid + "/status")
			if err != nil {
				return m, err
			}
			for _, line := range strings.Split(string(status), "\n") {
				k, v, _ := strings.Cut(line, ":")
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				switch k {
				case "VmRSS":
					m.VmRSS = kb << 10
				case "RssAnon":
					m.RssAnon = kb << 10
				case "RssFile":
					m.RssFile = kb << 10
				}
			}
			return m, nil
		}
	}
	return m, fmt.Errorf("agent pod %s: no hwdra process in its cgroup %s", p.Name, dirs[0])
}
