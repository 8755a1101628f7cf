// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/types"

	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/backend/sriov"
)

// Prepared is what the NIC driver holds: its prepared claims by UID, a
// snapshot that never waits on a checkpoint write (prepare.Plugin).
type Prepared interface {
	Claims() map[types.UID]prepare.Claim[nic.Record]
}

// attachment is the plan for one VF of a pod: which netdev goes in, under
// which name and with which settings.
type attachment struct {
	Claim metadata.ClaimRef
	VF    nic.VF
	// Interface is its name in the pod.
	Interface string
	MTU       int
	MAC       string
	Addresses []netip.Prefix
	Routes    []sriov.Route
}

func (a attachment) String() string {
	return fmt.Sprintf("claim %s, request %q, device %s (VF %s)", a.Claim, a.VF.Request, a.VF.Device, a.VF.PCIAddress)
}

// plan lists, without touching anything, the VFs of the prepared claims
// the pod uses, in a stable order (claims by namespace, name and UID; a
// claim's VFs in prepare order), with their interface names: the
// VfConfig's, else net1, net2, ... skipping names taken by the others.
// A pod uses the claims reserved for it when they were prepared
// (Record.Pods) and those it names (uses: the names of its ResourceClaims,
// in its namespace): the kubelet prepares a claim once, so a second pod
// sharing it is in no record. VFs without a netdev (bound to vfio-pci)
// stay out: nothing moves. Two VFs asking for one name are an error naming
// both; on error the list is still returned (without names), so that the
// claims' status can say why.
func plan(pd pod, claims map[types.UID]prepare.Claim[nic.Record], uses []string) ([]attachment, error) {
	var refs []metadata.ClaimRef
	for uid, c := range claims {
		if slices.Contains(c.Record.Pods, pd.UID) || c.Namespace == pd.Namespace && slices.Contains(uses, c.Name) {
			refs = append(refs, metadata.ClaimRef{UID: uid, Namespace: c.Namespace, Name: c.Name})
		}
	}
	sort.Slice(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
	var (
		out   []attachment
		named = map[string]string{} // interface name -> who asked for it
	)
	for _, ref := range refs {
		for _, vf := range claims[ref.UID].Record.VFs {
			if vf.Netdev == "" {
				continue
			}
			a := attachment{Claim: ref, VF: vf, Interface: vf.Network.InterfaceName, MTU: vf.Applied.MTU, MAC: vf.Applied.MAC}
			out = append(out, a)
			if err := out[len(out)-1].parse(); err != nil {
				return out, fmt.Errorf("%s: %w", a, err)
			}
			if a.Interface != "" {
				if other, ok := named[a.Interface]; ok {
					return out, fmt.Errorf("%s and %s both ask for interface name %q in the pod", other, a, a.Interface)
				}
				named[a.Interface] = a.String()
			}
		}
	}
	next := 1
	for i := range out {
		if out[i].Interface != "" {
			continue
		}
		for ; named[sriovv1alpha1.DefaultInterfacePrefix+strconv.Itoa(next)] != ""; next++ {
		}
		out[i].Interface = sriovv1alpha1.DefaultInterfacePrefix + strconv.Itoa(next)
		named[out[i].Interface] = out[i].String()
	}
	return out, nil
}

// parse reads the recorded addresses and routes (validated at prepare;
// a record that no longer parses is an error, not skipped).
func (a *attachment) parse() error {
	for _, s := range a.VF.Network.Addresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("address %q: %w", s, err)
		}
		a.Addresses = append(a.Addresses, p)
	}
	for _, r := range a.VF.Network.Routes {
		dst, err := netip.ParsePrefix(r.Destination)
		if err != nil {
			return fmt.Errorf("route destination %q: %w", r.Destination, err)
		}
		rt := sriov.Route{Destination: dst}
		if r.Gateway != "" {
			if rt.Gateway, err = netip.ParseAddr(r.Gateway); err != nil {
				return fmt.Errorf("route gateway %q: %w", r.Gateway, err)
			}
		}
		a.Routes = append(a.Routes, rt)
	}
	if a.MAC == "00:00:00:00:00:00" {
		a.MAC = "" // "clear": the VF driver keeps its own
	}
	return nil
}
