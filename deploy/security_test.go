// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/hwdra/hwdra/internal/backend"
)

// shipped decodes the objects of one kind from deploy/hwdra.yaml (the
// chart with its defaults) into new(T)s.
func shipped[T any](t *testing.T, kind string) []*T {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	var out []*T
	for {
		var meta struct{ Kind string }
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if len(raw.Raw) == 0 {
			continue
		}
		if err := utilyaml.Unmarshal(raw.Raw, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Kind != kind {
			continue
		}
		obj := new(T)
		if err := utilyaml.Unmarshal(raw.Raw, obj); err != nil {
			t.Fatal(err)
		}
		out = append(out, obj)
	}
}

func agentDaemonSet(t *testing.T) (*appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	ds := shipped[appsv1.DaemonSet](t, "DaemonSet")
	if len(ds) != 1 || len(ds[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d DaemonSets, want the agent's with one container", len(ds))
	}
	return ds[0], ds[0].Spec.Template.Spec.Containers[0]
}

// TestAgentMountsOnlyDriverRoots: with its defaults the chart mounts no
// host / into the agent, but each root the agent looks for the NVIDIA
// driver in (backend.KnownRoots), read-only, where --host-root says: for
// the driver on the node itself the folders the agent and NVIDIA's nvcdi
// read (programs and libraries under /usr, the toolkit's CDI spec).
func TestAgentMountsOnlyDriverRoots(t *testing.T) {
	ds, c := agentDaemonSet(t)
	host := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--host-root="); ok {
			host = v
		}
	}
	if host == "" {
		t.Fatalf("no --host-root in %v", c.Args)
	}
	hostPaths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			if v.HostPath.Path == "/" {
				t.Errorf("volume %s mounts the node's /", v.Name)
			}
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	// Under host: the node path each mount shows.
	shown := map[string]string{}
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(m.MountPath, host+"/")
		if !ok {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s is writable", m.MountPath)
		}
		if hostPaths[m.Name] != "/"+rel {
			t.Errorf("%s shows the node's %q, want /%s", m.MountPath, hostPaths[m.Name], rel)
		}
		shown["/"+rel] = m.Name
	}
	covered := func(p string) bool {
		for q := p; q != "/"; q = filepath.Dir(q) {
			if _, ok := shown[q]; ok {
				return true
			}
		}
		return false
	}
	for _, root := range backend.KnownRoots {
		want := []string{root}
		if root == "/" {
			want = []string{"/usr/bin", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/etc/cdi", "/lib/firmware"}
		}
		for _, p := range want {
			if !covered(p) {
				t.Errorf("known driver root %s: the node's %s is not mounted under %s", root, p, host)
			}
		}
	}
	if len(shown) > 5 {
		t.Errorf("%d mounts under %s, more than the driver roots need: %v", len(shown), host, shown)
	}
}

// TestAgentContainerLocked: the agent's image is read-only; what stays
// privileged is said in the chart and docs/security.md.
func TestAgentContainerLocked(t *testing.T) {
	_, c := agentDaemonSet(t)
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("the agent's root file system is writable: %+v", sc)
	}
}

// TestAgentRBAC holds the agent's ClusterRole to the calls it makes
// (docs/security.md, What each privilege is for): a change of rights is a
// change of this table and of that document.
func TestAgentRBAC(t *testing.T) {
	ds, _ := agentDaemonSet(t)
	var bound []string // the ClusterRoles bound to the agent's ServiceAccount
	for _, b := range shipped[rbacv1.ClusterRoleBinding](t, "ClusterRoleBinding") {
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == ds.Spec.Template.Spec.ServiceAccountName && s.Namespace == ds.Namespace {
				bound = append(bound, b.RoleRef.Name)
			}
		}
	}
	if len(bound) != 1 {
		t.Fatalf("ClusterRoles %v bound to the agent's ServiceAccount %s/%s, want one", bound, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
	}
	var roles []*rbacv1.ClusterRole
	for _, r := range shipped[rbacv1.ClusterRole](t, "ClusterRole") {
		if r.Name == bound[0] {
			roles = append(roles, r)
		}
	}
	if len(roles) != 1 {
		t.Fatalf("%d ClusterRoles named %s, want the agent's", len(roles), bound[0])
	}
	want := map[string][]string{
		"resource.k8s.io/resourceslices":        {"create", "delete", "list", "update", "watch"},
		"resource.k8s.io/resourceclaims":        {"get", "list"},
		"resource.k8s.io/resourceclaims/status": {"patch", "update"},
		"resource.k8s.io/resourceclaims/driver": {"associated-node:patch", "associated-node:update"},
		"/nodes":                                {"get", "list", "watch"},
		"/pods":                                 {"list", "watch"},
		"events.k8s.io/events":                  {"create", "patch"},
	}
	got := map[string][]string{}
	for _, r := range roles[0].Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("non-resource URLs %v", r.NonResourceURLs)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				if res == "resourceclaims/driver" && !slices.Equal(r.ResourceNames, []string{"gpu.hwdra.io", "sriov.hwdra.io"}) {
					t.Errorf("%s for %v, want the agent's drivers alone", key, r.ResourceNames)
				}
				if res != "resourceclaims/driver" && len(r.ResourceNames) > 0 {
					t.Errorf("%s limited to %v: no rule but the drivers' names one", key, r.ResourceNames)
				}
				got[key] = append(got[key], r.Verbs...)
			}
		}
	}
	for key := range got {
		slices.Sort(got[key])
	}
	for key, verbs := range want {
		if !slices.Equal(got[key], verbs) {
			t.Errorf("%s: verbs %v, want %v", key, got[key], verbs)
		}
	}
	for key, verbs := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("%s: verbs %v, want none", key, verbs)
		}
	}
}
