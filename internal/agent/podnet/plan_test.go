// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/hw"
)

func vfRec(addr, netdev, request, ifname string) nic.VF {
	return nic.VF{Request: request, Pool: "node", Device: "nic-0000-17-00-0", PCIAddress: addr, Netdev: netdev,
		Applied: hw.VFConfig{MTU: 1500}, Network: nic.Network{InterfaceName: ifname}}
}

func claimFor(ns, name string, pods []types.UID, vfs ...nic.VF) prepare.Claim[nic.Record] {
	return prepare.Claim[nic.Record]{Namespace: ns, Name: name, State: prepare.StatePrepared, Record: nic.Record{Pods: pods, VFs: vfs}}
}

func podIn(ns string, uid types.UID) pod {
	return pod{UID: uid, Namespace: ns, Name: string(uid), Ref: ns + "/" + string(uid)}
}

func TestPlanNamesAndOrder(t *testing.T) {
	pod := types.UID("pod-1")
	other := types.UID("pod-2")
	for _, tc := range []struct {
		name   string
		claims map[types.UID]prepare.Claim[nic.Record]
		uses   []string // claim names the pod refers to
		want   []string // "<vf>=<interface>"
		err    string
	}{
		{
			name: "defaults in claim order, then request order",
			claims: map[types.UID]prepare.Claim[nic.Record]{
				"b": claimFor("ns", "b", []types.UID{pod}, vfRec("0000:17:01.2", "v2", "x", "")),
				"a": claimFor("ns", "a", []types.UID{pod}, vfRec("0000:17:01.0", "v0", "x", ""), vfRec("0000:17:01.1", "v1", "y", "")),
			},
			want: []string{"0000:17:01.0=net1", "0000:17:01.1=net2", "0000:17:01.2=net3"},
		},
		{
			name: "explicit names are kept and skipped by the defaults",
			claims: map[types.UID]prepare.Claim[nic.Record]{
				"a": claimFor("ns", "a", []types.UID{pod}, vfRec("0000:17:01.0", "v0", "x", ""), vfRec("0000:17:01.1", "v1", "y", "net1")),
			},
			want: []string{"0000:17:01.0=net2", "0000:17:01.1=net1"},
		},
		{
			name: "other pods' claims and VFs without a netdev stay out",
			claims: map[types.UID]prepare.Claim[nic.Record]{
				"a": claimFor("ns", "a", []types.UID{other}, vfRec("0000:17:01.0", "v0", "x", "")),
				"b": claimFor("ns", "b", []types.UID{other, pod}, vfRec("0000:17:01.1", "", "x", ""), vfRec("0000:17:01.2", "v2", "y", "fast")),
			},
			want: []string{"0000:17:01.2=fast"},
		},
		{
			name: "a claim prepared for another pod that the pod names (a shared claim), not one of another namespace",
			claims: map[types.UID]prepare.Claim[nic.Record]{
				"a": claimFor("ns", "shared", []types.UID{other}, vfRec("0000:17:01.0", "v0", "x", "")),
				"b": claimFor("other-ns", "shared", []types.UID{other}, vfRec("0000:17:01.1", "v1", "x", "")),
			},
			uses: []string{"shared", "gpu"},
			want: []string{"0000:17:01.0=net1"},
		},
		{
			name: "two VFs asking for one name",
			claims: map[types.UID]prepare.Claim[nic.Record]{
				"a": claimFor("ns", "a", []types.UID{pod}, vfRec("0000:17:01.0", "v0", "x", "data")),
				"b": claimFor("ns", "b", []types.UID{pod}, vfRec("0000:17:01.1", "v1", "y", "data")),
			},
			err: `claim ns/a, request "x", device nic-0000-17-00-0 (VF 0000:17:01.0) and claim ns/b, request "y", device nic-0000-17-00-0 (VF 0000:17:01.1) both ask for interface name "data"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := plan(podIn("ns", pod), tc.claims, tc.uses)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, a := range got {
				names = append(names, a.VF.PCIAddress+"="+a.Interface)
			}
			if strings.Join(names, " ") != strings.Join(tc.want, " ") {
				t.Errorf("plan %v, want %v", names, tc.want)
			}
		})
	}
}

func TestPlanParsesNetwork(t *testing.T) {
	vf := vfRec("0000:17:01.0", "v0", "x", "")
	vf.Applied.MAC = "00:00:00:00:00:00"
	vf.Network.Addresses = []string{"10.0.0.5/24", "fd00::5/64"}
	vf.Network.Routes = []sriovv1alpha1.Route{{Destination: "0.0.0.0/0", Gateway: "10.0.0.1"}, {Destination: "10.9.0.0/16"}}
	got, err := plan(podIn("ns", "p"), map[types.UID]prepare.Claim[nic.Record]{"a": claimFor("ns", "a", []types.UID{"p"}, vf)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := got[0]
	if a.MAC != "" || len(a.Addresses) != 2 || a.Addresses[1].String() != "fd00::5/64" || len(a.Routes) != 2 ||
		a.Routes[0].Gateway.String() != "10.0.0.1" || a.Routes[1].Gateway.IsValid() {
		t.Errorf("parsed %+v", a)
	}
	vf.Network.Routes = []sriovv1alpha1.Route{{Destination: "nowhere"}}
	if _, err := plan(podIn("ns", "p"), map[types.UID]prepare.Claim[nic.Record]{"a": claimFor("ns", "a", []types.UID{"p"}, vf)}, nil); err == nil ||
		!strings.Contains(err.Error(), `claim ns/a`) || !strings.Contains(err.Error(), `route destination "nowhere"`) {
		t.Errorf("bad route: %v", err)
	}
}
