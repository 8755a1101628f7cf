// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// probes answer the DaemonSet's readiness and liveness probes.
//
// Ready (/readyz): this agent serves the node: it holds the node's state,
// the kubelet has registered each of its kubelet plugins, each driver's
// last publication is in the API server, and the NRI plugin (on a node
// with NICs) is synchronized with the runtime. In a rolling update the
// old pod is deleted once the new one is ready. A ready agent that
// publishes a reduced device model (a DRA feature gate off in the API
// server), or leaves GPUs to NVIDIA's device plugin, says so after its
// "ok": the node serves as it can or as configured.
//
// Alive (/healthz): the registration socket of every plugin this agent
// started accepts connections (the kubelet finds the plugins through
// them). An agent waiting for the node, or one that handed it over, is
// alive.
type probes struct {
	mu      sync.Mutex
	state   string // why not serving; "" while serving
	plugins []startedPlugin
	// published is nil once each driver's last publication is in the API
	// server (publish.Publisher.Verified); nri once the NRI plugin is
	// synchronized.
	published func() error
	nri       func() error
	// degraded is nil while the full device model is published
	// (publish.Publisher.Degraded).
	degraded func() error
	// withheld says why GPUs are not published, "" if all are: ready
	// all the same (the agent serves the node as it should), but /readyz
	// says so.
	withheld func() string
	// requested tells whether a newer agent asks for the node.
	requested func() bool
	// api is nil while the API server answers, else what is unreachable.
	api func() error
	// driver says where the NVIDIA driver is, "" on a node without
	// NVIDIA GPUs for it.
	driver func() string
}

type startedPlugin struct {
	driver, socket string
	helper         *kubeletplugin.Helper
}

const (
	stateWaiting     = "waiting for the node's state (another agent holds it)"
	stateStarting    = "starting"
	stateHandingOver = "handing the node over to a newer agent"
	stateHandedOver  = "handed the node over to a newer agent"
)

func newProbes() *probes { return &probes{state: stateWaiting} }

// setRequested sets how to tell whether a newer agent asks for the node;
// /readyz may already be serving.
func (p *probes) setRequested(requested func() bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requested = requested
}

func (p *probes) setState(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = s
	if s == stateHandedOver {
		p.plugins, p.published, p.nri, p.degraded, p.withheld = nil, nil, nil, nil, nil
	}
}

func (p *probes) serving(published, nri, degraded func() error, withheld func() string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state, p.published, p.nri, p.degraded, p.withheld = "", published, nri, degraded, withheld
}

// notes are what /readyz says besides "ok": where the NVIDIA driver is,
// GPUs left to the device plugin, and a "warning: " line for a reduced
// device model, for a claim-limits policy below the node's GPUs and for
// an API server without granular claim status authorization.
func (p *probes) notes() []string {
	p.mu.Lock()
	degraded, withheld, driver := p.degraded, p.withheld, p.driver
	p.mu.Unlock()
	var out []string
	if driver != nil {
		if d := driver(); d != "" {
			out = append(out, d)
		}
	}
	if withheld != nil {
		if w := withheld(); w != "" {
			out = append(out, w)
		}
	}
	if degraded != nil {
		if err := degraded(); err != nil {
			// errors.Join: a line for each.
			errs := []error{err}
			if joined, ok := err.(interface{ Unwrap() []error }); ok {
				errs = joined.Unwrap()
			}
			for _, e := range errs {
				out = append(out, "warning: "+e.Error())
			}
		}
	}
	return out
}

func (p *probes) setDriver(driver func() string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.driver = driver
}

func (p *probes) setAPIServer(unreachable func() error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.api = unreachable
}

func (p *probes) addPlugin(driver, socket string, h *kubeletplugin.Helper) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plugins = append(p.plugins, startedPlugin{driver: driver, socket: socket, helper: h})
}

// ready is nil when the agent serves the node, else every reason why not.
func (p *probes) ready() error {
	p.mu.Lock()
	state, plugins, published, nri, requested, api := p.state, p.plugins, p.published, p.nri, p.requested, p.api
	p.mu.Unlock()
	var unreachable error
	if api != nil {
		unreachable = api()
	}
	if state != "" {
		return errors.Join(errors.New(state), unreachable)
	}
	if requested != nil && requested() {
		return errors.New(stateHandingOver)
	}
	errs := []error{unreachable}
	for _, pl := range plugins {
		if st := pl.helper.RegistrationStatus(); st == nil || !st.PluginRegistered {
			reason := "the kubelet has not registered it yet"
			if st != nil && st.Error != "" {
				reason = "the kubelet refused it: " + st.Error
			}
			errs = append(errs, fmt.Errorf("kubelet plugin %s: %s", pl.driver, reason))
		}
	}
	if published != nil {
		errs = append(errs, published())
	}
	if nri != nil {
		errs = append(errs, nri())
	}
	return errors.Join(errs...)
}

// alive is nil unless a started plugin's registration socket refuses
// connections.
func (p *probes) alive() error {
	p.mu.Lock()
	plugins := p.plugins
	p.mu.Unlock()
	var errs []error
	for _, pl := range plugins {
		c, err := net.DialTimeout("unix", pl.socket, 2*time.Second)
		if err != nil {
			errs = append(errs, fmt.Errorf("kubelet plugin %s: registration socket: %w", pl.driver, err))
			continue
		}
		c.Close()
	}
	return errors.Join(errs...)
}

// registrarSocket is the registration socket the kubelet plugin library
// creates for a driver.
func registrarSocket(dir, driver, podUID string) string {
	if podUID != "" {
		return filepath.Join(dir, kubeletplugin.RollingUpdateRegistrarSocketFile(dir, driver, types.UID(podUID)))
	}
	return filepath.Join(dir, driver+"-reg.sock")
}

// handler answers a probe: 503 and why when check fails, else "ok" and
// the notes (nil: none), one a line.
func (p *probes) handler(check func() error, notes func() []string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		body := "ok\n"
		if notes != nil {
			for _, n := range notes() {
				body += n + "\n"
			}
		}
		_, _ = w.Write([]byte(body)) // a prober that hung up learns nothing more
	}
}

// listenShared listens on addr with SO_REUSEPORT: in a rolling update the
// new pod (host network, same port) listens beside the old one, which
// closes its listener once it has handed the node over. Meanwhile the
// kernel spreads connections over both; neither says ready then (the old
// one says so while a newer one waits: see serve), and both say alive.
func listenShared(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		return errors.Join(err, serr)
	}}
	return lc.Listen(ctx, "tcp", addr)
}
