// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestDeployManifests: the chart was installed at node start; the plain
// manifests (deploy/hwdra.yaml, the chart rendered with its defaults) and
// the chart rendered with a test cluster's values (MIG profiles as
// extended resources among them) and with the suite's are accepted object
// by object by the API server (server-side dry run, admission included),
// every field kept (CEL selectors compiled, extendedResourceName taken, no
// field dropped by a gate); every example claim is accepted as written,
// prioritized lists and capacity requests included.
func TestDeployManifests(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	dir, err := framework.DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	ns := n.CreateNamespace(t, "examples")
	plain, err := os.ReadFile(filepath.Join(dir, "hwdra.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	testValues, err := os.ReadFile(filepath.Join(dir, "helm", "hwdra", "ci", "mock-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ciValues map[string]any
	if err := yaml.Unmarshal(testValues, &ciValues); err != nil {
		t.Fatal(err)
	}
	renders := map[string]string{"deploy/hwdra.yaml": string(plain)}
	// The chart's classes (gpu, mig, vgpu, passthrough, share and
	// dedicated-share of gpu.hwdra.io; vf-share and vf of sriov.hwdra.io),
	// and a DeviceClass per MIG profile offered as an extended resource on
	// top.
	const nClasses = 8
	classCount := map[string]int{"deploy/hwdra.yaml": nClasses, "chart, default values": nClasses, "chart, the suite's values": nClasses,
		"chart, ci/mock-values.yaml": nClasses + len(ciValues["extendedResources"].(map[string]any)["migProfiles"].([]any))}
	for name, values := range map[string]map[string]any{
		"chart, default values":      nil,
		"chart, ci/mock-values.yaml": ciValues,
		"chart, the suite's values":  n.AgentPodValues(t, "mock:dgx-h100"),
	} {
		out, err := n.RenderChart(ctx, values)
		if err != nil {
			t.Fatal(err)
		}
		renders[name] = out
	}
	for name, manifest := range renders {
		t.Run(name, func(t *testing.T) {
			objs, err := framework.ReadObjects(strings.NewReader(manifest))
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				// Under names of their own: an apply over the installed
				// release's objects would show their merge.
				dry := o.DeepCopy()
				if dry.GetNamespace() != "" {
					dry.SetNamespace(ns)
				} else {
					dry.SetName(dry.GetName() + "-e2e-dry-run")
				}
				got, err := framework.ApplyDryRun(ctx, n.AdminConfig, ns, dry)
				if err != nil {
					t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
					continue
				}
				for _, field := range []string{"spec", "rules", "roleRef", "subjects", "data"} {
					if w, ok := o.Object[field]; ok {
						if diff := framework.Missing(w, got[0].Object[field]); len(diff) > 0 {
							t.Errorf("%s %s: the server dropped or changed fields:\n%v", o.GetKind(), o.GetName(), diff)
						}
					}
				}
			}
			// ClusterRoles: the agent's and the two of hwdra pool-status
			// users (aggregated); admission policies: the agent's slices,
			// its Events, the claim limits and the VF policy; ConfigMaps:
			// the agent's config and the Grafana dashboard.
			for kind, want := range map[string]int{"DaemonSet": 1, "DeviceClass": classCount[name], "ClusterRole": 3, "ClusterRoleBinding": 1,
				"ServiceAccount": 1, "ValidatingAdmissionPolicy": 4, "ValidatingAdmissionPolicyBinding": 4, "ConfigMap": 2} {
				if kinds[kind] != want {
					t.Errorf("%d %s objects, want %d (all: %v)", kinds[kind], kind, want, kinds)
				}
			}
		})
	}

	examples, _ := filepath.Glob(filepath.Join(dir, "examples", "*.yaml"))
	if len(examples) == 0 {
		t.Fatalf("no examples in %s", dir)
	}
	for _, f := range examples {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			want, err := framework.ReadObjects(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			got, err := framework.ApplyFile(ctx, n.AdminConfig, f, ns)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if w, ok := want[i].Object["spec"]; ok {
					if diff := framework.Missing(w, got[i].Object["spec"]); len(diff) > 0 {
						t.Errorf("%s %s: the server dropped or changed fields:\n%v", want[i].GetKind(), want[i].GetName(), diff)
					}
				}
			}
		})
	}

	classes, err := n.Admin.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, c := range classes.Items {
		have[c.Name] = true
	}
	for _, name := range []string{"gpu.hwdra.io", "mig.gpu.hwdra.io", "vgpu.gpu.hwdra.io", "share.gpu.hwdra.io", "dedicated-share.gpu.hwdra.io", "vf-share.sriov.hwdra.io", "vf.sriov.hwdra.io"} {
		if !have[name] {
			t.Errorf("DeviceClass %s missing", name)
		}
	}
}

// TestDeployPodSecurity: the suite's API server enforces the baseline Pod
// Security standard on every namespace without a label of its own, as
// hardened clusters do; the chart was installed from the suite's registry
// into a namespace created with the label the README's install sets. The
// agent's pod (the installed DaemonSet's template) is admitted there and
// refused, naming what baseline forbids, in a namespace without the label.
func TestDeployPodSecurity(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agentNS, err := n.Admin.CoreV1().Namespaces().Get(ctx, framework.AgentNamespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := agentNS.Labels[framework.PodSecurityLabel]; got != "privileged" {
		t.Errorf("namespace %s: %s=%q, want privileged", agentNS.Name, framework.PodSecurityLabel, got)
	}
	ds, err := n.Admin.AppsV1().DaemonSets(framework.AgentNamespace).Get(ctx, "hwdra-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, framework.AgentImageRepository+":") {
		t.Errorf("the installed DaemonSet runs %s, want an image pushed to %s", img, framework.AgentImageRepository)
	}
	pod := func(ns string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-pod-security", Namespace: ns},
			Spec:       *ds.Spec.Template.Spec.DeepCopy(),
		}
		// The agent's service account is in its own namespace only, and
		// the service account check comes before Pod Security's.
		p.Spec.ServiceAccountName = "default"
		return p
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := n.Admin.CoreV1().Pods(framework.AgentNamespace).Create(ctx, pod(framework.AgentNamespace), dry); err != nil {
		t.Errorf("the agent's pod in its labelled namespace: %v", err)
	}
	plain := n.CreateNamespace(t, "no-psa-label")
	_, err = n.Admin.CoreV1().Pods(plain).Create(ctx, pod(plain), dry)
	if err == nil || !strings.Contains(err.Error(), `violates PodSecurity "baseline:latest"`) ||
		!strings.Contains(err.Error(), "hostNetwork") || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("the agent's pod in a namespace without the label: %v, want refused by Pod Security baseline naming hostNetwork and privileged", err)
	}
}
