// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// cudaNode has its driver installed as NVIDIA's CUDA images lay it out
// (/usr/local/nvidia: bin/, lib64/) and no NVIDIA Container Toolkit.
const cudaNode = `
gpus:
- model: h100-80gb
  count: 1
driver: {root: /usr/local/nvidia}
`

// TestPodLoadsDriverLibraries: on a node without any toolkit spec, a
// container of an image that is not NVIDIA's (cudaapp: its program and
// glibc, nothing else) loads libcuda.so.1 from the mock driver root
// through its claim's CDI edits: the library of the driver's version
// mounted where it is under the root (/lib64), its soname linked and
// found by the dynamic linker through the ld cache that the hooks of the
// edits updated (Debian's loader does not search /lib64 by itself), run
// from the nvidia-cdi-hook the agent installed on the node.
func TestPodLoadsDriverLibraries(t *testing.T) {
	s, mockDir, _ := startLastingAgentPod(t, "driver-libs", cudaNode)
	libs, _ := filepath.Glob(filepath.Join(mockDir, "host/usr/local/nvidia/lib64/libcuda.so.*.*"))
	if len(libs) != 1 {
		t.Fatalf("the mock's driver root has libcuda files %v, want one of its version", libs)
	}
	// The mock's stand-in becomes a library a program can load.
	if err := framework.BuildStandInLibcuda(libs[0]); err != nil {
		t.Fatal(err)
	}
	tmpl := s.template(exampleClaim(t, "gpu-full.yaml"))
	pod := framework.PodWithClaimTemplate("cuda", tmpl)
	pod.Spec.Containers[0].Image = framework.CUDAAppImage
	since := s.createPodFor(pod)
	if _, err := s.n.WaitPodRunning(s.ctx, s.ns, "cuda", podRunningTimeout); err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "driver-libs pod", time.Since(since))
	logs, err := s.n.WaitPodLogs(s.ctx, s.ns, "cuda", "app", "=== CUDA ", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := "libcuda.so.1 cuInit=0 version=12040 hwdra-mock-libcuda"; !strings.Contains(logs, want) {
		t.Errorf("the container did not load the driver root's libcuda (want %q):\n%s", want, logs)
	}

	// What the claim's CDI spec gave it: the library from the driver
	// root, the hooks from the agent's state directory on the node.
	specs, _ := filepath.Glob(filepath.Join(s.n.CDIDir, gpuDriver+"_claim_*"))
	if len(specs) != 1 {
		t.Fatalf("claim CDI specs %v, want one", specs)
	}
	data, err := os.ReadFile(specs[0])
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := yaml.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	edits := spec.Devices[0].ContainerEdits
	mounted, hooked := false, false
	for _, m := range edits.Mounts {
		mounted = mounted || m.HostPath == libs[0] && m.ContainerPath == "/lib64/"+filepath.Base(libs[0])
	}
	for _, h := range edits.Hooks {
		hooked = hooked || h.Path == filepath.Join(s.n.AgentPodStateDir(), "bin", "nvidia-cdi-hook") && strings.Join(h.Args, " ") == "nvidia-cdi-hook update-ldcache --folder /lib64"
	}
	if !mounted || !hooked {
		t.Errorf("the claim's CDI spec lacks the library mount (%v) or the ld cache hook from the agent's state directory (%v): %s", mounted, hooked, data)
	}
	if toolkit, _ := filepath.Glob(filepath.Join(s.n.CDIDir, "nvidia*")); len(toolkit) > 0 {
		t.Errorf("a toolkit spec on the node: %v", toolkit)
	}
}
