// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/stub"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/keyedlock"
	"github.com/hwdra/hwdra/internal/state"
)

// DefaultSocket is where containerd and CRI-O listen for NRI plugins.
const DefaultSocket = "/var/run/nri/nri.sock"

// PluginName and PluginIndex register the plugin with the runtime
// ("10-hwdra-sriov"); the index orders it among other plugins.
const (
	PluginName  = "hwdra-sriov"
	PluginIndex = "10"
)

// Options configure a Plugin.
type Options struct {
	// DriverName is the NIC driver's ("sriov.hwdra.io"): status entries
	// and the placements file are named after it.
	DriverName string
	// Socket is the runtime's NRI socket.
	Socket string
	// StateDir holds the placements ("<driver>.netns.json").
	StateDir string
	// SysfsRoot ("/sys") tells a VF's netdev by its PCI address.
	SysfsRoot string
	// HostNetns is the namespace VF netdevs live in when in no pod: ""
	// for the agent's own (tests give a throwaway one).
	HostNetns string
	// RDMA moves VFs' RDMA devices with their netdevs; nil never does.
	RDMA hw.RDMANetns
	// Status gets each claim's network status; nil writes none.
	Status *metadata.StatusWriter
	// BootID of the running kernel; empty reads /proc.
	BootID string
	// ReturnWait bounds how long returning a VF waits for the kernel to
	// bring it back from a destroyed namespace (default 1 s).
	ReturnWait time.Duration
	// Sysfs, if set, is made current after netdevs moved, before anyone
	// reads it (backend.Node): the kernel's is at once; the mock's
	// follows link events.
	Sysfs Settler
	// Pods, if set, names the ResourceClaims a pod refers to: a pod that
	// shares a claim prepared for another one is found through it.
	Pods Pods
	// Observer, if set, learns how long each runtime hook took and its
	// error: the runtime waits for it (and drops a plugin that misses its
	// timeout, 2 s in containerd).
	Observer HookObserver
	// Links, if set, finds VF netdevs that the kernel cannot tell apart
	// by their parent device: the mock's veth stand-ins (backend.Node).
	// Nil (a host): the kernel's word, sriov.Netns.VFLink.
	Links Links
	// Events, if set, records a Warning Event on a pod whose VF cannot be
	// found to return it.
	Events Events
}

// Links finds a VF's netdev in a network namespace (open as nsFD) by
// identity, never by name: its ifindex and name, 0 and "" where it is
// not.
type Links interface {
	VFLink(nsFD int, vfPCIAddress string) (index int, name string, err error)
}

// Events records Events (k8s.io/client-go/tools/events.EventRecorder).
type Events interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...interface{})
}

// Settler makes the hardware's view of netdevs current.
type Settler interface {
	Settle()
}

// Pods knows the node's pods.
type Pods interface {
	// ClaimsOf names the ResourceClaims a pod refers to (by namespace,
	// name and UID); nil when it does not know the pod.
	ClaimsOf(namespace, name string, uid types.UID) []string
}

// HookObserver learns each runtime hook's duration and error
// ("RunPodSandbox", ...).
type HookObserver interface {
	ObserveHook(hook string, took time.Duration, err error)
}

// MetadataWriter rewrites a request's KEP-5304 metadata file
// (kubeletplugin.Helper).
type MetadataWriter interface {
	UpdateRequestMetadata(ctx context.Context, namespace, name string, uid types.UID, request string, devices []kubeletplugin.Device) error
}

// Plugin is the NRI plugin that moves prepared VFs into pods.
type Plugin struct {
	opts   Options
	host   *sriov.Netns
	ledger *state.Ledger[Placement]
	vfs    keyedlock.Locks // by VF PCI address

	// Set by Run, before the first connection.
	prepared Prepared
	meta     MetadataWriter

	mu        sync.Mutex
	synced    bool // connected and synchronized with the runtime
	since     time.Time
	lastError error
}

// PlacementsFile is the placements' name in the state directory.
func PlacementsFile(driver string) string { return driver + ".netns.json" }

// New opens the host namespace and the placements. Release works from
// here on; hooks once Run connects.
func New(opts Options) (*Plugin, error) {
	if opts.DriverName == "" || opts.StateDir == "" {
		return nil, errors.New("nri: DriverName and StateDir are required")
	}
	if opts.Socket == "" {
		opts.Socket = DefaultSocket
	}
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = sriov.DefaultSysfsRoot
	}
	if opts.BootID == "" {
		opts.BootID = prepare.BootID()
	}
	if opts.ReturnWait <= 0 {
		opts.ReturnWait = time.Second
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	host, err := sriov.OpenNetns(opts.HostNetns)
	if err != nil {
		return nil, fmt.Errorf("nri: %w", err)
	}
	l, err := state.OpenLedger[Placement](filepath.Join(opts.StateDir, PlacementsFile(opts.DriverName)))
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("nri: %w", err)
	}
	p := &Plugin{opts: opts, host: host, ledger: l, since: time.Now(), lastError: errors.New("not connected yet")}
	// Placements of an earlier boot: those namespaces and the VFs'
	// settings went with the reboot.
	for _, addr := range l.Keys() {
		if pl, _ := l.Get(addr); pl.BootID != opts.BootID {
			if err := l.Delete(addr); err != nil {
				host.Close()
				return nil, err
			}
		}
	}
	return p, nil
}

// Socket is the NRI socket the plugin connects to.
func (p *Plugin) Socket() string { return p.opts.Socket }

// Close releases the host namespace.
func (p *Plugin) Close() error { return p.host.Close() }

// Ready is nil while the plugin is connected to the runtime and
// synchronized with it. Otherwise a pod would start without its network,
// and the error says so.
func (p *Plugin) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.synced {
		return nil
	}
	return fmt.Errorf("no NRI connection to the container runtime at %s (%v, since %s): a pod must not start without its network device",
		p.opts.Socket, p.lastError, p.since.Format(time.RFC3339))
}

func (p *Plugin) setSynced(ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.synced != ok {
		p.since = time.Now()
	}
	p.synced, p.lastError = ok, err
}

// Run connects to the runtime's NRI socket and serves its hooks until ctx
// ends, reconnecting with backoff (250 ms doubling to 10 s) whenever the
// runtime goes away or restarts. prepared holds the prepared NIC claims
// and meta writes their metadata files.
func (p *Plugin) Run(ctx context.Context, prepared Prepared, meta MetadataWriter) error {
	logger := klog.FromContext(ctx).WithName("nri")
	p.prepared, p.meta = prepared, meta
	const minBackoff, maxBackoff = 250 * time.Millisecond, 10 * time.Second
	backoff := minBackoff
	for {
		started := time.Now()
		err := p.serve(klog.NewContext(ctx, logger))
		if ctx.Err() != nil {
			p.setSynced(false, ctx.Err())
			return nil //nolint:nilerr // stopped, as asked: no error
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		p.setSynced(false, err)
		if time.Since(started) > 30*time.Second {
			backoff = minBackoff // it was up a while: a restart, not a flap
		}
		klog.Warningf("NRI: no connection to the container runtime at %s (%v); NIC claims are refused until it is back; retrying in %v", p.opts.Socket, err, backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// serve runs one connection.
func (p *Plugin) serve(ctx context.Context) error {
	s, err := stub.New(&hooks{p: p},
		stub.WithPluginName(PluginName), stub.WithPluginIdx(PluginIndex),
		stub.WithSocketPath(p.opts.Socket), stub.WithLogger(nriLogger{}),
		stub.WithOnClose(func() { p.setSynced(false, errors.New("connection closed by the runtime")) }))
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// nriLogger sends the NRI stub's messages to klog.
type nriLogger struct{}

func (nriLogger) Debugf(_ context.Context, f string, a ...any) { klog.V(4).Infof("NRI: "+f, a...) }
func (nriLogger) Infof(_ context.Context, f string, a ...any)  { klog.V(2).Infof("NRI: "+f, a...) }
func (nriLogger) Warnf(_ context.Context, f string, a ...any)  { klog.Warningf("NRI: "+f, a...) }
func (nriLogger) Errorf(_ context.Context, f string, a ...any) { klog.Errorf("NRI: "+f, a...) }
