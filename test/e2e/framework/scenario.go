// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// Helpers for pod scenarios: custom mock hardware, pods that must stay
// unscheduled, cleanup that waits until claims are released, and what a
// container should have received from a claim's CDI spec.

// Timing logs how long a scenario step took as "TIMING <scenario> <duration>"
// (scenario without spaces), for grepping the suite's output.
func Timing(t testing.TB, scenario string, d time.Duration) {
	t.Helper()
	t.Logf("TIMING %s %v", strings.ReplaceAll(scenario, " ", "_"), d.Round(time.Millisecond))
}

// MockProfile writes a mock hardware profile (mock/profile's schema) to a
// file name.yaml in t's temp directory and returns the --hardware value
// for it, "mock:<file>".
func MockProfile(t testing.TB, name, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return "mock:" + path
}

// WaitPodUnschedulable waits until the scheduler reports that it cannot
// place the pod (condition PodScheduled=False, reason Unschedulable) and
// returns the pod with the scheduler's message.
func (n *Node) WaitPodUnschedulable(ctx context.Context, ns, name string, timeout time.Duration) (*corev1.Pod, string, error) {
	var msg string
	pod, err := n.WaitPod(ctx, ns, name, timeout, "reported unschedulable", func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
				return p.Spec.NodeName == ""
			}
		}
		return false
	})
	return pod, msg, err
}

// CheckPodStaysPending fails unless the pod stays unbound and Pending for
// the whole of d.
func (n *Node) CheckPodStaysPending(ctx context.Context, ns, name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		p, err := n.Admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
			return fmt.Errorf("pod %s/%s did not stay Pending: %s", ns, name, n.describePod(ns, name, p))
		}
		if time.Now().After(deadline) {
			return nil
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// DeletePod deletes a pod and waits until it is gone.
func (n *Node) DeletePod(ctx context.Context, ns, name string, timeout time.Duration) error {
	if err := n.Admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return n.WaitPodGone(ctx, ns, name, timeout)
}

// DeletePodsAndClaims deletes every pod and ResourceClaim of the namespace
// and waits until they are gone: the kubelet has unprepared the claims and
// the scheduler's allocations are released, so that the next scenario
// starts from a free node (deleting the namespace alone returns before).
func (n *Node) DeletePodsAndClaims(ctx context.Context, ns string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods := n.Admin.CoreV1().Pods(ns)
	claims := n.Admin.ResourceV1().ResourceClaims(ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods of %s: %w", ns, err)
	}
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete claims of %s: %w", ns, err)
	}
	for {
		pl, perr := pods.List(ctx, metav1.ListOptions{})
		cl, cerr := claims.List(ctx, metav1.ListOptions{})
		if perr == nil && cerr == nil && len(pl.Items) == 0 && len(cl.Items) == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			var left []string
			if pl != nil {
				for _, p := range pl.Items {
					left = append(left, "pod "+p.Name+" ("+n.describePod(ns, p.Name, &p)+")")
				}
			}
			if cl != nil {
				for _, c := range cl.Items {
					left = append(left, "claim "+c.Name)
				}
			}
			return fmt.Errorf("namespace %s: still there after %v: %s", ns, timeout, strings.Join(left, "; "))
		}
	}
}

// PublishedDevice is the device driver/pool/name as this node's
// ResourceSlices publish it now.
func (n *Node) PublishedDevice(ctx context.Context, driver, pool, name string) (*resourceapi.Device, error) {
	list, err := n.Admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + n.Name + ",spec.driver=" + driver,
	})
	if err != nil {
		return nil, err
	}
	for _, s := range list.Items {
		if s.Spec.Pool.Name != pool {
			continue
		}
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == name {
				return &s.Spec.Devices[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no device %s/%s/%s in the slices of node %s", driver, pool, name, n.Name)
}

// ClaimCDISpec reads the CDI spec the driver wrote for a claim
// ("<driver>_claim_<uid>.json" in the node's CDI directory); nil when
// there is none (no device of the claim needs container edits).
func (n *Node) ClaimCDISpec(driver string, uid types.UID) (*cdispec.Spec, error) {
	data, err := os.ReadFile(filepath.Join(n.CDIDir, driver+"_claim_"+string(uid)+".json"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("CDI spec of claim %s: %w", uid, err)
	}
	return &spec, nil
}

// MissingEdits lists what the container lacks of a CDI device's container
// edits: device nodes (with their type and numbers, among the paths the
// app was asked to show) and environment variables. Empty when it got all.
func (o AppOutput) MissingEdits(edits cdispec.ContainerEdits) []string {
	var missing []string
	for _, d := range edits.DeviceNodes {
		kind := "char" // type "c", or "" (the runtime then stats the host node)
		if d.Type == "b" {
			kind = "block"
		}
		want := fmt.Sprintf("%s %d:%d", kind, d.Major, d.Minor)
		if got, ok := o.Devices[d.Path]; !ok {
			missing = append(missing, fmt.Sprintf("device node %s (%s): absent", d.Path, want))
		} else if got != want {
			missing = append(missing, fmt.Sprintf("device node %s: %s, the spec says %s", d.Path, got, want))
		}
	}
	for _, kv := range edits.Env {
		k, v, _ := strings.Cut(kv, "=")
		if got, ok := o.Env[k]; !ok {
			missing = append(missing, fmt.Sprintf("env %s: absent, the spec says %q", k, v))
		} else if got != v {
			missing = append(missing, fmt.Sprintf("env %s=%q, the spec says %q", k, got, v))
		}
	}
	return missing
}

// WaitPoolsComplete waits until every pool of driver on this node has all
// the slices its latest generation announces (resourceSliceCount): the
// scheduler ignores an incomplete pool, so a pod created earlier would
// wait for the rest.
func (n *Node) WaitPoolsComplete(ctx context.Context, driver string, timeout time.Duration) ([]resourceapi.ResourceSlice, error) {
	var items []resourceapi.ResourceSlice
	err := waitfor.Check(ctx, "complete pools of "+driver+" on node "+n.Name, timeout, func() error {
		list, err := n.Admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + n.Name + ",spec.driver=" + driver,
		})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 || !poolsComplete(list.Items) {
			return fmt.Errorf("%d slices, pools incomplete", len(list.Items))
		}
		items = list.Items
		return nil
	})
	if err != nil {
		return nil, err
	}
	return items, nil
}

func poolsComplete(slices []resourceapi.ResourceSlice) bool {
	type key struct {
		pool string
		gen  int64
	}
	latest := map[string]int64{}
	want := map[key]int64{}
	have := map[key]int64{}
	for _, s := range slices {
		p := s.Spec.Pool
		latest[p.Name] = max(latest[p.Name], p.Generation)
		k := key{p.Name, p.Generation}
		want[k] = p.ResourceSliceCount
		have[k]++
	}
	for pool, gen := range latest {
		k := key{pool, gen}
		if have[k] != want[k] {
			return false
		}
	}
	return true
}

// KubeletLogSize is the current length of the kubelet's log, a starting
// point for WaitDriverRegistered.
func (n *Node) KubeletLogSize() int64 {
	st, err := os.Stat(n.Kubelet.LogPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// WaitDriverRegistered waits until the kubelet has registered a DRA driver's
// plugin and connected to it, as its log says after offset since (from
// KubeletLogSize before the agent started). A pod prepared before that
// fails with "DRA driver ... is not registered" and waits for the
// kubelet's retry backoff, seconds later. When an agent restarts, the
// kubelet's plugin manager notices the old registration socket gone and
// the new one on its reconcile loop (every second), so the new plugin may
// be registered a second or two after the agent published its slices.
func (n *Node) WaitDriverRegistered(ctx context.Context, driver string, since int64, timeout time.Duration) error {
	// k8s.io/kubernetes pkg/kubelet/cm/dra/plugin (V(2) in v1.37).
	want := []string{`"Connection changed"`, `driverName="` + driver + `"`, `connected=true`}
	return waitfor.Until(ctx, fmt.Sprintf("the kubelet registering DRA driver %s (%s in its log)", driver, strings.Join(want, " ")), timeout, func() bool {
		data, err := readFrom(n.Kubelet.LogPath, since)
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(data), "\n") {
			found := true
			for _, w := range want {
				found = found && strings.Contains(line, w)
			}
			if found {
				return true
			}
		}
		return false
	})
}

func readFrom(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}
