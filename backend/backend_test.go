package backend

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestOpenRejectsUnknownHardware(t *testing.T) {
	for _, spec := range []string{"", "gpu", "mock:", "mock:nope"} {
		if _, err := Open(spec); err == nil || !strings.Contains(err.Error(), "mock") {
			t.Errorf("Open(%q): %v", spec, err)
		}
	}
}

// TestHostChangesSignalLinkEvents runs in a throwaway network namespace: a
// link appearing there must make the host backend signal a change.
func TestHostChangesSignalLinkEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace and links")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // switches this thread
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		netns.Set(orig)
		ns.Close()
	}()

	n := &Node{} // the host backend's change watch, without opening NVML
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := n.Changes(ctx)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hwdra-t0"}, PeerName: "hwdra-t1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled for a new link")
	}
}
