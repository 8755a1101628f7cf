// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// CreateNamespace makes a fresh namespace for t, waits for its default
// ServiceAccount (pods are refused until the controller-manager made it) and
// deletes it when t ends.
func (n *Node) CreateNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := n.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Admin.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	waitfor.NoError(t, "namespace "+ns.Name+"'s default ServiceAccount", 30*time.Second, func() error {
		_, err := n.Admin.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	return ns.Name
}

// TestAppPod is a pod running the test app, which prints its environment
// and the given paths, then sleeps. It terminates at once when deleted.
func TestAppPod(name string, paths ...string) *corev1.Pod {
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "app",
				Image:           TestAppImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            paths,
			}},
		},
	}
}

// WaitPod waits until cond holds for the pod, and returns it. The error
// tells the pod's last phase, conditions and events.
func (n *Node) WaitPod(ctx context.Context, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var pod *corev1.Pod
	for {
		p, err := n.Admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			pod = p
			if cond(p) {
				return p, nil
			}
			if p.Status.Phase == corev1.PodFailed {
				break
			}
		} else if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			return nil, err
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return pod, fmt.Errorf("pod %s/%s not %s within %v: %s", ns, name, what, timeout, n.describePod(ns, name, pod))
}

// WaitPodRunning waits until every container of the pod runs.
func (n *Node) WaitPodRunning(ctx context.Context, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	return n.WaitPod(ctx, ns, name, timeout, "Running", func(p *corev1.Pod) bool {
		if p.Status.Phase != corev1.PodRunning {
			return false
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return false
			}
		}
		return true
	})
}

func (n *Node) describePod(ns, name string, pod *corev1.Pod) string {
	var b strings.Builder
	if pod != nil {
		fmt.Fprintf(&b, "phase=%s node=%q", pod.Status.Phase, pod.Spec.NodeName)
		for _, c := range pod.Status.Conditions {
			fmt.Fprintf(&b, "; %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, "; container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
			}
		}
	}
	events, err := n.Admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "\n  event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// PodLogs returns a container's log (the container's own output, read
// through the apiserver and the kubelet like `kubectl logs`).
func (n *Node) PodLogs(ctx context.Context, ns, name, container string) (string, error) {
	data, err := n.Admin.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	return string(data), err
}

// WaitPodLogs waits until the container's log contains want (a container
// may be Running before its first line is written) and returns the log.
func (n *Node) WaitPodLogs(ctx context.Context, ns, name, container, want string, timeout time.Duration) (string, error) {
	var logs string
	err := waitfor.Check(ctx, fmt.Sprintf("%q in the log of %s/%s", want, ns, name), timeout, func() error {
		var err error
		if logs, err = n.PodLogs(ctx, ns, name, container); err == nil && !strings.Contains(logs, want) {
			err = errors.New("not yet")
		}
		return err
	})
	return logs, err
}

// WaitPodGone waits until the pod object is deleted (the kubelet has
// stopped its containers and the API object is removed).
func (n *Node) WaitPodGone(ctx context.Context, ns, name string, timeout time.Duration) error {
	var p *corev1.Pod
	if err := waitfor.Until(ctx, "pod "+ns+"/"+name+" gone", timeout, func() bool {
		var err error
		p, err = n.Admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); err != nil {
		return fmt.Errorf("%w: %s", err, n.describePod(ns, name, p))
	}
	return nil
}
