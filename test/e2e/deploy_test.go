package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestDeployManifests: deploy/ was applied at node start; every object is
// stored as written (CEL selectors compiled, no field dropped by a gate), and
// every example claim is accepted as written, prioritized lists and
// capacity requests included.
func TestDeployManifests(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	dir, err := framework.DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	examples, _ := filepath.Glob(filepath.Join(dir, "examples", "*.yaml"))
	if len(files) == 0 || len(examples) == 0 {
		t.Fatalf("no manifests in %s", dir)
	}
	ns := n.CreateNamespace(t, "examples")
	for _, f := range append(files, examples...) {
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
				for _, field := range []string{"spec", "rules", "roleRef", "subjects"} {
					if w, ok := want[i].Object[field]; ok {
						if diff := framework.Missing(w, got[i].Object[field]); len(diff) > 0 {
							t.Errorf("%s %s: the server dropped or changed fields:\n%v", want[i].GetKind(), want[i].GetName(), diff)
						}
					}
				}
			}
		})
	}

	// The DaemonSet is validated, not run: no node has its image.
	daemonsets, _ := filepath.Glob(filepath.Join(dir, "daemonset", "*.yaml"))
	for _, f := range daemonsets {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := framework.ReadObjects(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := framework.ApplyDryRun(ctx, n.AdminConfig, ns, objs...); err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
		}
	}

	classes, err := n.Admin.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, c := range classes.Items {
		have[c.Name] = true
	}
	for _, name := range []string{"gpu.hwdra.io", "mig.gpu.hwdra.io", "vgpu.gpu.hwdra.io", "vf-share.sriov.hwdra.io", "vf.sriov.hwdra.io"} {
		if !have[name] {
			t.Errorf("DeviceClass %s missing", name)
		}
	}
}
