// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestPodVGPU: on a vGPU host (mock:h100-vgpu) a pod asking for a vGPU
// (deploy/examples/vgpu.yaml) runs. Its container's own output shows the
// VFIO device nodes (/dev/vfio/vfio and the mdev's IOMMU group) and the
// HWDRA_<device>_MDEV variable of our CDI spec, and the KEP-5304 metadata
// file names the device and its mediated device's UUID, the same as the
// variable. Deleting the pod removes the claim's CDI spec.
func TestPodVGPU(t *testing.T) {
	s := startScenario(t, "pod-vgpu", "mock:h100-vgpu", gpuDriver)
	tmpl := s.template(exampleClaim(t, "vgpu.yaml"))
	r := s.runPod("vgpu", tmpl, "vgpu", "/dev", framework.MetadataPath("devices", "vgpu", gpuDriver))

	res := result(t, r.claim, "vgpu")
	if res.Driver != gpuDriver {
		t.Fatalf("request vgpu allocated from %s", res.Driver)
	}
	published, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
	if err != nil {
		t.Fatal(err)
	}
	vgpuType := sliceAttr(published, gpuDriver+"/vgpuType")
	t.Logf("allocated %s (vGPU type %s)", res.Device, vgpuType)

	attrs := metadataDevice(t, r, res)
	if typ := attrValue(attrs, gpuDriver, "type"); typ != "vgpu" {
		t.Errorf("metadata type %v, want vgpu", typ)
	}
	for _, a := range []string{"vgpuType", "parentUUID"} {
		if got, want := attrValue(attrs, gpuDriver, a), sliceAttr(published, gpuDriver+"/"+resourceapi.QualifiedName(a)); got != want {
			t.Errorf("metadata %s %v, the slice publishes %q", a, got, want)
		}
	}
	mdev, _ := attrValue(attrs, gpuDriver, "mdevUUID").(string)
	if mdev == "" {
		t.Errorf("metadata has no mdevUUID: %v", attrs)
	}
	// KubeVirt's virt-launcher reads the unqualified key.
	if vm, _ := attrs["mdevUUID"]["string"].(string); vm != mdev {
		t.Errorf("metadata mdevUUID (the key KubeVirt reads) %q, want %q: %v", vm, mdev, attrs)
	}
	if env := gpuEnvName(res.Device, "MDEV"); r.out.Env[env] != mdev {
		t.Errorf("container env %s=%q, metadata mdevUUID %q", env, r.out.Env[env], mdev)
	}

	// The VFIO nodes a VM runner opens: the container (misc 10:196) and
	// the mdev's IOMMU group.
	if got := r.out.Devices["/dev/vfio/vfio"]; got != "char 10:196" {
		t.Errorf("/dev/vfio/vfio in the container: %q, want char 10:196 (devices %v)", got, r.out.Devices)
	}
	var groups []string
	for p := range r.out.Devices {
		if g, ok := strings.CutPrefix(p, "/dev/vfio/"); ok && g != "vfio" {
			groups = append(groups, p)
		}
	}
	if len(groups) != 1 {
		t.Errorf("container has %d VFIO group nodes, want 1: %v", len(groups), groups)
	}
	spec := checkCDI(t, s.n, gpuDriver, r)
	if spec == nil {
		t.Fatalf("no CDI spec for claim %s", r.claim.Name)
	}
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			if !strings.HasPrefix(n.Path, "/dev/vfio/") {
				t.Errorf("vGPU CDI spec gives the container %s: a vGPU's container gets its VFIO nodes only", n.Path)
			}
		}
	}

	s.deletePod("vgpu")
	waitCDISpecGone(t, s.n, gpuDriver, r.claim)
}

// gpuEnvName is the agent's HWDRA_<DEVICE>_<what>: the device name in upper
// case, "_" for anything but a letter or digit.
func gpuEnvName(device, what string) string {
	return "HWDRA_" + strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z':
			return c - 'a' + 'A'
		case c >= '0' && c <= '9':
			return c
		}
		return '_'
	}, device) + "_" + what
}

// oneH100 is a node with one H100 80GB, MIG off as shipped: the agent
// switches MIG on for the first MIG claim.
const oneH100 = `
gpus:
- model: h100-80gb
  count: 1
`

// migClaim is deploy/examples/mig-1g.10gb.yaml asking for another profile.
func migClaim(t *testing.T, profile string) *resourceapi.ResourceClaim {
	t.Helper()
	c := exampleClaim(t, "mig-1g.10gb.yaml")
	c.Name = "mig-" + strings.ReplaceAll(strings.ReplaceAll(profile, ".", "-"), "+", "-")
	sel := c.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL
	expr := strings.Replace(sel.Expression, strconv.Quote("1g.10gb"), strconv.Quote(profile), 1)
	if expr == sel.Expression && profile != "1g.10gb" {
		t.Fatalf("mig-1g.10gb.yaml: no profile \"1g.10gb\" to replace in %q", sel.Expression)
	}
	sel.Expression = expr
	return c
}

// TestPodsMIGProfiles: on one H100 80GB, pods asking for MIG partitions of
// three profiles — 4g.40gb, 2g.20gb and 1g.10gb, which together take all 7
// of its compute slices (3g.40gb + 4g.40gb + 1g.10gb would need 8) — all
// run at once. Each container gets its own MIG device: distinct UUIDs and
// capability nodes, non-overlapping placements, each with the profile it
// asked for.
func TestPodsMIGProfiles(t *testing.T) {
	s := startScenario(t, "pods-mig", framework.MockProfile(t, "one-h100", oneH100), gpuDriver)
	type migPod struct {
		profile string
		ran     ran
		start   int
		size    int
		uuid    string
		caps    []string
	}
	// Created one after the other, each running before the next, largest
	// first: the scheduler then has one choice each (4g.40gb at memory
	// slices 0-3, its only placement, 2g.20gb at 4-5, 1g.10gb at 6). A
	// 1g.10gb placed first could take slice 0 and leave no room for the
	// 4g.40gb.
	pods := []*migPod{{profile: "4g.40gb"}, {profile: "2g.20gb"}, {profile: "1g.10gb"}}
	for _, p := range pods {
		claim := migClaim(t, p.profile)
		name := strings.TrimPrefix(claim.Name, "mig-") // "4g-40gb"
		tmpl := s.template(claim)
		p.ran = s.runPod(name, tmpl, "mig-"+p.profile, "/dev", framework.MetadataPath("devices", "mig", gpuDriver))
		r := p.ran
		res := result(t, r.claim, "mig")
		published, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
		if err != nil {
			t.Fatal(err)
		}
		if got := sliceAttr(published, gpuDriver+"/profile"); got != p.profile {
			t.Errorf("pod %s: allocated %s of profile %q, want %q", name, res.Device, got, p.profile)
		}
		attrs := metadataDevice(t, r, res)
		if got := attrValue(attrs, gpuDriver, "profile"); got != p.profile {
			t.Errorf("pod %s: metadata profile %v, want %s", name, got, p.profile)
		}
		start, _ := attrValue(attrs, gpuDriver, "placementStart").(float64)
		size, _ := attrValue(attrs, gpuDriver, "placementSize").(float64)
		p.start, p.size = int(start), int(size)
		p.uuid, _ = attrValue(attrs, gpuDriver, "uuid").(string)
		if env := gpuEnvName(res.Device, "UUID"); p.uuid == "" || r.out.Env[env] != p.uuid {
			t.Errorf("pod %s: container env %s=%q, metadata uuid %q", name, env, r.out.Env[env], p.uuid)
		}
		for dev := range r.out.Devices {
			if strings.HasPrefix(dev, "/dev/nvidia-caps/") {
				p.caps = append(p.caps, dev)
			}
		}
		if len(p.caps) != 2 {
			t.Errorf("pod %s: %d MIG capability nodes, want 2 (GPU and compute instance): %v", name, len(p.caps), p.caps)
		}
		if spec := checkCDI(t, s.n, gpuDriver, r); spec == nil {
			t.Errorf("pod %s: no CDI spec for claim %s", name, r.claim.Name)
		}
		t.Logf("pod %s: %s at memory slices %d-%d, %s, %v", name, res.Device, p.start, p.start+p.size-1, p.uuid, p.caps)
	}

	// All still run, each on its own partition.
	for i, p := range pods {
		pod, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, p.ran.pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s after the other MIG pods started", pod.Name, pod.Status.Phase)
		}
		for _, q := range pods[i+1:] {
			if p.start < q.start+q.size && q.start < p.start+p.size {
				t.Errorf("%s at %d+%d and %s at %d+%d overlap", p.profile, p.start, p.size, q.profile, q.start, q.size)
			}
			if p.uuid == q.uuid {
				t.Errorf("%s and %s have the same MIG device UUID %s", p.profile, q.profile, p.uuid)
			}
			for _, c := range p.caps {
				for _, d := range q.caps {
					if c == d {
						t.Errorf("%s and %s both have the capability node %s", p.profile, q.profile, c)
					}
				}
			}
		}
	}
}
