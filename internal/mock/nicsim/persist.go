// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// Snapshot puts the NICs' state in s: every VF's settings and the links
// that are down.
func (n *NICs) Snapshot(s *persist.State) {
	if vfs := n.recorder.Snapshot(); len(vfs) > 0 {
		s.VFs = vfs
	}
	s.LinksDown = n.linksDown()
}

// Restore puts freshly built NICs in a saved state: links, then VFs.
func (n *NICs) Restore(s persist.State) error {
	if err := n.restoreLinks(s.LinksDown); err != nil {
		return err
	}
	return n.recorder.restore(s.VFs)
}

// restore applies saved VF settings (keyed like Snapshot); with veth
// stand-ins, MTU and link state go to the VF's veth as well.
func (r *VFRecorder) restore(saved map[string]hw.VFConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, cfg := range saved {
		i := strings.LastIndexByte(key, '/')
		index, err := strconv.Atoi(key[i+1:])
		pf := r.pfs[key[:max(i, 0)]]
		if i < 0 || err != nil || pf == nil || index < 0 || index >= len(pf.vfs) {
			return fmt.Errorf("VF %q: no such VF on this node", key)
		}
		vf := &pf.vfs[index]
		if cfg.NetdevUp != nil {
			cfg.NetdevUp = ptrTo(*cfg.NetdevUp)
		}
		vf.cfg = cfg
		if r.netdev == nil || vf.netdev == "" {
			continue
		}
		if cfg.MTU != 0 {
			if err := r.netdev(vf.netdev, cfg.MTU, nil); err != nil {
				return fmt.Errorf("VF %s: MTU of %s: %w", key, vf.netdev, err)
			}
		}
		if cfg.NetdevUp != nil {
			if err := r.netdev(vf.netdev, 0, cfg.NetdevUp); err != nil {
				return fmt.Errorf("VF %s: link state of %s: %w", key, vf.netdev, err)
			}
		}
	}
	return nil
}
