// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// Tenants against the MPS daemons (issue 34, rows 1 and 5, and the
// daemons' privileges), from inside the containers of MPS clients: the
// test app acts as a hostile tenant (TESTAPP_TENANT, images/testapp).

// tenantPod is a test-app pod acting as a tenant (actions: TESTAPP_TENANT).
func tenantPod(pod *corev1.Pod, actions string) *corev1.Pod {
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "TESTAPP_TENANT", Value: actions})
	return pod
}

var tenantLine = regexp.MustCompile(`(?m)^=== TENANT (\S+) (\S+): (.*)$`)

// tenantResults are the results of the app's tenant actions, by
// "action path".
func tenantResults(logs string) map[string]string {
	out := map[string]string{}
	for _, m := range tenantLine.FindAllStringSubmatch(logs, -1) {
		out[m[1]+" "+m[2]] = m[3]
	}
	return out
}

// nodeShmMount is the mount on a daemon's shared-memory directory as the
// node sees it ("" for none).
func nodeShmMount(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, _ := strings.Cut(line, " - ")
		if f := strings.Fields(pre); len(f) >= 6 && f[4] == dir {
			return strings.Fields(post)[0] + " " + f[5]
		}
	}
	return ""
}

const (
	tenantShmSize       = 64 << 20
	tenantDaemonMemory  = 512 << 20
	tenantShmSizeConfig = "64Mi"
)

// TestTenantMPSSharedMemory (issue 34, row 5, and the daemon's
// privileges): two pods with share claims on one H100 reach one daemon.
// In the first container /dev/shm is a tmpfs of gpus.mps.shmSize mounted
// nosuid,nodev,noexec: a program copied there does not run, and writing
// stops at the size (ENOSPC), not at the node's disk. The second
// tenant's container sees the first's file there: MPS servers and
// clients meet in one /dev/shm, so every client of a daemon shares it
// (docs/design.md). On the node the daemon is the agent's stand-in with
// a few environment variables, no service account token in its mounts,
// the control daemon's capabilities only, no_new_privs, in a cgroup of
// its own beside the agent's pod with gpus.mps.daemonMemoryLimit. Once the
// shares go, the tmpfs is unmounted and its directory gone.
func TestTenantMPSSharedMemory(t *testing.T) {
	s := startScenarioWith(t, "tenant-mps-shm", framework.MockProfile(t, "one-h100", oneH100),
		map[string]any{"gpus": map[string]any{"mps": map[string]any{"shmSize": tenantShmSizeConfig, "daemonMemoryLimit": strconv.Itoa(tenantDaemonMemory)}}}, gpuDriver)
	a := tenantPod(framework.PodWithClaimTemplate("tenant-a", s.template(gpuShareClaim(t, "tenant-a", "20Gi", "40")), mpsPaths...),
		"mount:/dev/shm;exec:/dev/shm/run-me;remove:/dev/shm/run-me;fill:/dev/shm/fill;remove:/dev/shm/fill;write:/dev/shm/tenant-a=of tenant a")
	ra := s.waitRunning("tenant-a", "tenant shm pod", s.createPodFor(a))
	pid := mpsClient(t, "tenant-a", ra, "40", "0=20480M")
	res := tenantResults(ra.logs)
	t.Logf("tenant a: %v", res)
	mount := res["mount /dev/shm"]
	if !strings.HasPrefix(mount, "tmpfs ") || !strings.HasSuffix(mount, fmt.Sprintf(" size=%d", tenantShmSize)) {
		t.Errorf("the container's /dev/shm is %q, want a tmpfs of %d bytes", mount, tenantShmSize)
	}
	for _, o := range []string{"nosuid", "nodev", "noexec"} {
		if !slices.Contains(strings.Split(strings.Fields(mount + " x")[1], ","), o) {
			t.Errorf("the container's /dev/shm is mounted %q, without %s", mount, o)
		}
	}
	if got := res["exec /dev/shm/run-me"]; !strings.Contains(got, "permission denied") {
		t.Errorf("a program copied into /dev/shm: %q, want permission denied", got)
	}
	if got := res["fill /dev/shm/fill"]; !strings.Contains(got, "no space left on device") {
		t.Errorf("filling /dev/shm: %q, want it stopped by the size", got)
	}

	b := framework.PodWithClaimTemplate("tenant-b", s.template(gpuShareClaim(t, "tenant-b", "10Gi", "30")), mpsPaths...)
	rb := s.waitRunning("tenant-b", "tenant shm pod", s.createPodFor(b))
	if p := mpsClient(t, "tenant-b", rb, "30", "0=10240M"); p != pid {
		t.Fatalf("the second share reaches daemon %s, the first %s", p, pid)
	}
	// What is shared: the other tenant's files in the one /dev/shm.
	if got, ok := rb.out.Files["/dev/shm/tenant-a"]; !ok || strings.TrimSpace(got) != "of tenant a" {
		t.Errorf("the second tenant does not see the first's file in the daemon's /dev/shm (%q %v): have MPS clients stopped sharing it? Then say so in docs/design.md", got, ok)
	}

	daemonPrivileges(t, pid)
	ids := daemonLogs(t, s.n)
	if len(ids) != 1 {
		t.Fatalf("daemons %v, want one", ids)
	}
	var shm string
	for id := range ids {
		shm = filepath.Join(s.n.AgentPodStateDir(), "mps", id, "shm")
		checkDaemonCgroup(t, pid, "hwdra-mps-"+id)
	}
	if m := nodeShmMount(t, shm); !strings.HasPrefix(m, "tmpfs ") {
		t.Errorf("the node sees %q on %s, want the daemon's tmpfs (the state directory's mounts propagate)", m, shm)
	}
	for _, name := range []string{"tenant-a", "tenant-b"} {
		s.deletePod(name)
	}
	if !waitGone(s.ctx, pid, 30*time.Second) {
		t.Errorf("the MPS daemon %s still runs after its last share went", pid)
	}
	if m := nodeShmMount(t, shm); m != "" {
		t.Errorf("the daemon's shared memory is still mounted on the node after it stopped: %s", m)
	}
	if _, err := os.Stat(filepath.Dir(shm)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory after it stopped: %v", err)
	}
}

// daemonPrivileges checks what the daemon process holds, as the node sees
// it.
func daemonPrivileges(t *testing.T, pid string) {
	t.Helper()
	read := func(f string) string {
		data, err := os.ReadFile(filepath.Join("/proc", pid, f))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	for _, kv := range strings.Split(read("environ"), "\x00") {
		name, _, _ := strings.Cut(kv, "=")
		if name != "" && !slices.Contains([]string{"PATH", "LD_LIBRARY_PATH", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES"}, name) {
			t.Errorf("the daemon's environment has %s", name)
		}
	}
	tokens, _ := filepath.Glob(filepath.Join("/proc", pid, "root", "var/run/secrets/kubernetes.io/serviceaccount/*"))
	if len(tokens) > 0 {
		t.Errorf("the daemon sees the agent's service account: %v", tokens)
	}
	status := read("status")
	field := func(name string) string {
		for _, line := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	// chown, dac_override, fowner, kill, setgid, setuid.
	if got := field("CapEff"); got != "00000000000000eb" {
		t.Errorf("the daemon's CapEff is %s, want 00000000000000eb", got)
	}
	if got := field("CapBnd"); got != "00000000000000eb" {
		t.Errorf("the daemon's CapBnd is %s, want 00000000000000eb", got)
	}
	if got := field("NoNewPrivs"); got != "1" {
		t.Errorf("the daemon's NoNewPrivs is %s", got)
	}
}

// checkDaemonCgroup checks that the daemon is in its cgroup and that
// cgroup's memory limit (cgroup v1 or v2, as the node mounts them).
func checkDaemonCgroup(t *testing.T, pid, name string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	limited := false
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || filepath.Base(parts[2]) != name {
			continue
		}
		var f string
		switch {
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			f = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		case parts[1] == "":
			f = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max") // none on a hybrid node's unified hierarchy
		default:
			continue
		}
		v, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(v)) != strconv.Itoa(tenantDaemonMemory) {
			t.Errorf("%s: %s, want %d", f, strings.TrimSpace(string(v)), tenantDaemonMemory)
		}
		limited = true
	}
	if !limited {
		t.Errorf("the daemon %s is in no memory-limited cgroup %s: %s", pid, name, data)
	}
}

// TestTenantMPSPlantedPIDFile (issue 34, row 1) on the real node: a
// tenant pod of an MPS claim keeps a node process's PID (a sleep the test
// runs) in the daemon's PID file and deletes the control pipe; a second
// pod of the claim deletes it again once the daemon is back. Each time the
// agent finds the daemon down and starts it again; the sleep lives
// through both, and through the claim's end; the daemon recovers each
// time (a new process, running, which the pods' pipe directory reaches).
func TestTenantMPSPlantedPIDFile(t *testing.T) {
	s := startScenario(t, "tenant-mps-pid", framework.MockProfile(t, "one-h100", oneH100), gpuDriver)
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _ = sleep.Wait(); close(ended) }()
	t.Cleanup(func() { _ = sleep.Process.Kill(); <-ended })
	victim := strconv.Itoa(sleep.Process.Pid)

	claim := exampleClaim(t, "gpu-mps.yaml")
	claim.Namespace = s.ns
	if _, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Create(s.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pidFile, control := "/tmp/nvidia-mps/"+drivertools.PIDFile, "/tmp/nvidia-mps/control"
	a := tenantPod(framework.PodWithClaim("plant", claim.Name, mpsPaths...), "keep:"+pidFile+"="+victim+"\n;remove:"+control)
	ra := s.waitRunning("plant", "tenant pid pod", s.createPodFor(a))
	t.Logf("the planting tenant: %v", tenantResults(ra.logs))
	if got := tenantResults(ra.logs)["remove "+control]; got != "ok" {
		t.Fatalf("the tenant could not delete the control pipe: %q", got)
	}
	first := waitDaemonStarts(t, s, 2, victim)
	b := tenantPod(framework.PodWithClaim("delete", claim.Name, mpsPaths...), "remove:"+control)
	rb := s.waitRunning("delete", "tenant pid pod", s.createPodFor(b))
	if got := tenantResults(rb.logs)["remove "+control]; got != "ok" {
		t.Fatalf("the second tenant could not delete the control pipe: %q", got)
	}
	last := waitDaemonStarts(t, s, 3, victim)
	if first == last || running(first) {
		t.Errorf("the daemon %s was not replaced by %s", first, last)
	}
	select {
	case <-ended:
		t.Fatalf("the node process %s whose PID the tenant planted was killed", victim)
	default:
	}
	for _, name := range []string{"plant", "delete"} {
		s.deletePod(name)
	}
	if err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Delete(s.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitGone(s.ctx, last, 60*time.Second) {
		t.Errorf("the MPS daemon %s still runs after its claim went", last)
	}
	select {
	case <-ended:
		t.Fatalf("the node process %s whose PID the tenant planted was killed when the claim went", victim)
	default:
	}
	if err := sleep.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the sleep: %v", err)
	}
}

// waitDaemonStarts waits until the claim's daemon has started n times
// (its log's start events) and the last one runs and answers; it returns
// the last one's PID, which must not be the planted one.
func waitDaemonStarts(t *testing.T, s *scenario, n int, planted string) string {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(s.ctx, 250*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		for _, ev := range daemonLogs(t, s.n) {
			var starts []string
			for _, e := range ev {
				if e.Event == "start" {
					starts = append(starts, strconv.Itoa(e.PID))
				}
			}
			if len(starts) >= n {
				last = starts[len(starts)-1]
				return running(last), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the daemon did not start %d times: %v (logs %v)", n, err, daemonLogs(t, s.n))
	}
	if last == planted {
		t.Fatalf("the daemon's log names the planted PID %s", planted)
	}
	recs, _ := filepath.Glob(filepath.Join(s.n.AgentPodStateDir(), gpuDriver+".mps.json*"))
	for _, f := range recs {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), `"pid":`+planted+",") {
			t.Errorf("the agent records the planted PID %s as its daemon's: %s", planted, f)
		}
	}
	return last
}
