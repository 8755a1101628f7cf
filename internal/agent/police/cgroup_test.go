// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

const (
	uid = "0b7a2c1e-5f3d-4e2a-9c8b-1d2e3f4a5b6c"
	uu  = "0b7a2c1e_5f3d_4e2a_9c8b_1d2e3f4a5b6c" // as the systemd driver writes it
	cid = "4f8e1d2c3b4a59687766554433221100ffeeddccbbaa99887766554433221100"
)

// TestContainerOf: the pod and container of a process from its cgroup
// file, as containerd and CRI-O write them under both cgroup drivers,
// cgroup v1 and v2.
func TestContainerOf(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup string
		pod          types.UID
		container    string
		ok           bool
	}{
		{"containerd, systemd, v2", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uu + ".slice/cri-containerd-" + cid + ".scope\n", uid, cid, true},
		{"containerd, cgroupfs, v2", "0::/kubepods/besteffort/pod" + uid + "/" + cid + "\n", uid, cid, true},
		{"guaranteed, cgroupfs", "0::/kubepods/pod" + uid + "/" + cid + "\n", uid, cid, true},
		{"guaranteed, systemd", "0::/kubepods.slice/kubepods-pod" + uu + ".slice/cri-containerd-" + cid + ".scope\n", uid, cid, true},
		{"CRI-O, systemd, v2", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uu + ".slice/crio-" + cid + ".scope\n", uid, cid, true},
		{"CRI-O, cgroupfs, v1", "12:pids:/kubepods/burstable/pod" + uid + "/crio-" + cid + "\n11:memory:/kubepods/burstable/pod" + uid + "/crio-" + cid + "\n1:name=systemd:/kubepods/burstable/pod" + uid + "/crio-" + cid + "\n", uid, cid, true},
		{"containerd, systemd, v1 with a hierarchy outside", "13:rdma:/\n4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uu + ".slice/cri-containerd-" + cid + ".scope\n", uid, cid, true},
		{"cri-dockerd, systemd", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uu + ".slice/docker-" + cid + ".scope\n", uid, cid, true},
		{"relative to the agent's cgroup namespace", "0::/../../kubepods-besteffort-pod" + uu + ".slice/cri-containerd-" + cid + ".scope\n", uid, cid, true},
		{"a cgroup of its own below the container's", "0::/kubepods/burstable/pod" + uid + "/" + cid + "/worker\n", uid, cid, true},
		{"CRI-O's conmon: the pod, no container", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uu + ".slice/crio-conmon-" + cid + ".scope\n", uid, "", true},
		{"the pod's own cgroup", "0::/kubepods/burstable/pod" + uid + "\n", uid, "", true},
		{"a host service", "0::/system.slice/nvidia-persistenced.service\n", "", "", false},
		{"the agent's MPS daemons beside its pod", "0::/kubepods/besteffort/hwdra-mps\n", "", "", false},
		{"a user's session", "0::/user.slice/user-0.slice/session-1.scope\n", "", "", false},
		{"not a UID", "0::/kubepods/burstable/podnotauid/" + cid + "\n", "", "", false},
		{"empty (a kernel thread, a read of a gone process)", "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, container, ok := containerOf(tc.cgroup)
			if pod != tc.pod || container != tc.container || ok != tc.ok {
				t.Errorf("containerOf = %q, %q, %v; want %q, %q, %v", pod, container, ok, tc.pod, tc.container, tc.ok)
			}
		})
	}
}
