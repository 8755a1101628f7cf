package mock

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/hwdra/hwdra/hw"
)

// vethSet is the throwaway network namespace holding the stand-ins.
type vethSet struct {
	name   string // named netns, /run/netns/<name>
	ns     netns.NsHandle
	handle *netlink.Handle
	// peers: each stand-in's peer, whose state is the stand-in's carrier.
	peers map[string]string
}

// EnableVeths creates, in a new named network namespace, a veth pair for
// every PF netdev and every VF netdev of the mock, named like them (the
// kernel here has no dummy links; the peers are hwp<n>). A PF whose link
// is down gets its peer left down, so it has no carrier. Needs root;
// Hardware.Close deletes the namespace and with it the links.
func (n *NICs) EnableVeths() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths != nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("mock: veth stand-ins for NIC netdevs need root")
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	v := &vethSet{name: "hwdra-mock-" + hex.EncodeToString(suffix), peers: map[string]string{}}
	ns, err := newNamedNetns(v.name)
	if err != nil {
		return fmt.Errorf("mock: creating network namespace %s: %w", v.name, err)
	}
	v.ns = ns
	if v.handle, err = netlink.NewHandleAt(ns); err != nil {
		return errors.Join(fmt.Errorf("mock: netlink in %s: %w", v.name, err), v.close())
	}
	peer := 0
	add := func(name, mac string, mtu int, up, carrier bool) error {
		peer++
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU = name, mtu
		if hw, err := net.ParseMAC(mac); err == nil && len(hw) == 6 {
			la.HardwareAddr = hw
		}
		veth := &netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("hwp%d", peer)}
		if err := v.handle.LinkAdd(veth); err != nil {
			return fmt.Errorf("mock: veth %s: %w", name, err)
		}
		v.peers[name] = veth.PeerName
		if carrier {
			if err := v.setUp(veth.PeerName, true); err != nil {
				return err
			}
		}
		return v.setUp(name, up)
	}
	for _, pf := range n.pfs {
		mac := pfMAC(pf)
		if pf.linkType == hw.LinkInfiniBand {
			mac = "" // 20-byte IPoIB addresses do not fit a veth
		}
		if err := add(pf.netdev, mac, pf.mtu, true, pf.linkUp); err != nil {
			return errors.Join(err, v.close())
		}
		for _, vf := range pf.vfs {
			if vf.netdev == "" {
				continue
			}
			if err := add(vf.netdev, vf.mac, pf.mtu, false, true); err != nil {
				return errors.Join(err, v.close())
			}
		}
	}
	n.veths = v
	n.recorder.mu.Lock()
	n.recorder.netdev = v.apply
	n.recorder.mu.Unlock()
	return nil
}

// Netns is the name of the namespace holding the veth stand-ins
// (netns.GetFromName, `ip netns exec`), "" without them.
func (n *NICs) Netns() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths == nil {
		return ""
	}
	return n.veths.name
}

func (n *NICs) close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths == nil {
		return nil
	}
	err := n.veths.close()
	n.veths = nil
	return err
}

func (v *vethSet) setUp(name string, up bool) error {
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return fmt.Errorf("mock: %s: %w", name, err)
	}
	if up {
		err = v.handle.LinkSetUp(l)
	} else {
		err = v.handle.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("mock: %s: %w", name, err)
	}
	return nil
}

// apply sets MTU (if non-zero) or link state (if non-nil) of a stand-in.
func (v *vethSet) apply(name string, mtu int, up *bool) error {
	if up != nil {
		return v.setUp(name, *up)
	}
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return err
	}
	return v.handle.LinkSetMTU(l, mtu)
}

func (v *vethSet) close() error {
	if v.handle != nil {
		v.handle.Close()
	}
	err := v.ns.Close()
	// Unmounting the name drops the last reference: the namespace and the
	// veths in it go away.
	return errors.Join(err, netns.DeleteNamed(v.name))
}

// newNamedNetns creates a named namespace without moving the caller:
// netns.NewNamed switches the calling thread into it, so it runs on a
// locked thread of its own that switches back; a thread that cannot switch
// back stays locked and dies with its goroutine rather than serve other Go
// code from the wrong namespace.
func newNamedNetns(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return // thread exits locked
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if err != nil {
			ch <- result{err: err}
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		if err := netns.Set(orig); err != nil {
			ch <- result{ns: ns}
			return // thread exits locked
		}
		runtime.UnlockOSThread()
		ch <- result{ns: ns}
	}()
	r := <-ch
	return r.ns, r.err
}
