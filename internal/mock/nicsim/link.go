// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// SetLink takes a PF's link down (carrier lost) or up again, as pulling
// and plugging the cable would: the PF's netdev (named by netdev or PCI
// address) reports it in sysfs (operstate, carrier, speed), and with veth
// stand-ins the kernel does too: the PF's veth loses its carrier because
// its peer goes down, so netlink subscribers see the change.
func (n *NICs) SetLink(pf string, up bool) error {
	p, err := n.pf(pf)
	if err != nil {
		return err
	}
	if err := n.setLink(p, up); err != nil {
		return err
	}
	n.rep.Changed(persist.CallSetLink, p.netdev, true)
	return nil
}

// pf finds a PF by netdev name or PCI address.
func (n *NICs) pf(name string) (*mockPF, error) {
	var have []string
	for _, p := range n.pfs {
		if p.netdev == name || p.addr.String() == name {
			return p, nil
		}
		have = append(have, p.netdev+" ("+p.addr.String()+")")
	}
	return nil, fmt.Errorf("no PF %q on this mock node (PFs: %v)", name, have)
}

func (n *NICs) setLink(p *mockPF, up bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	state, carrier, speed := "down", "0", "-1"
	if up {
		state, carrier, speed = "up", "1", strconv.Itoa(p.speedMbps)
	}
	dir := filepath.Join(n.sysfs, "bus", "pci", "devices", p.addr.String(), "net", p.netdev)
	// The kernel updates carrier, then speed, then operstate; readers
	// see operstate last, as they would.
	for _, f := range []struct{ name, value string }{{"carrier", carrier}, {"speed", speed}, {"operstate", state}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.value+"\n"), 0o644); err != nil {
			return fmt.Errorf("mock: PF %s: %w", p.netdev, err)
		}
	}
	p.linkUp = up
	n.recorder.setSpeed(p.netdev, map[bool]int{true: p.speedMbps, false: 0}[up])
	if n.veths != nil {
		peer, ok := n.veths.peers[p.netdev]
		if !ok {
			return fmt.Errorf("mock: PF %s has no veth stand-in", p.netdev)
		}
		if err := n.veths.setUp(peer, up); err != nil {
			return err
		}
	}
	return nil
}

// linksDown lists the PFs whose link is down, for the saved state.
func (n *NICs) linksDown() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, p := range n.pfs {
		if !p.linkUp {
			out = append(out, p.netdev)
		}
	}
	return out
}

// restoreLinks applies a saved state's link states.
func (n *NICs) restoreLinks(down []string) error {
	for _, p := range n.pfs {
		want := true
		for _, d := range down {
			want = want && d != p.netdev
		}
		if p.linkUp == want {
			continue
		}
		if err := n.setLink(p, want); err != nil {
			return err
		}
	}
	for _, d := range down {
		if _, err := n.pf(d); err != nil {
			return fmt.Errorf("saved link state: %w", err)
		}
	}
	return nil
}

// setSpeed is the link speed the driver checks VF rates against (0: down).
func (r *VFRecorder) setSpeed(pf string, mbps int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pfs[pf]; p != nil {
		p.speedMbps = mbps
	}
}
