// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nritest runs NRI's runtime side (pkg/adaptation, what containerd
// embeds) in a test process, so that tests drive the agent's NRI plugin
// over a real socket as containerd would, and makes pod sandboxes with
// network namespaces of their own (root only).
package nritest

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/mock/nicsim"
)

// Runtime is NRI's runtime side listening on a socket. In process, a
// stopped runtime side keeps its plugins' connections open, so the socket
// the plugin dials is a relay that Stop cuts, as a runtime process's
// death would.
type Runtime struct {
	rt    *adaptation.Adaptation
	relay *relay
}

var seq atomic.Int64 // names the inner sockets

// Start starts the runtime side on sock; its Synchronize hands a
// connecting plugin the sandboxes pods returns (nil: none). It stops
// when t ends.
func Start(t testing.TB, sock string, pods func() []*api.PodSandbox) *Runtime {
	t.Helper()
	inner := sock + ".rt" + strconv.FormatInt(seq.Add(1), 10)
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		var sbs []*api.PodSandbox
		if pods != nil {
			sbs = pods()
		}
		_, err := cb(ctx, sbs, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	dir := filepath.Dir(sock)
	rt, err := adaptation.New("containerd", "v2.4.2", sync, update, adaptation.WithSocketPath(inner),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{rt: rt, relay: newRelay(t, sock, inner)}
	t.Cleanup(r.Stop)
	return r
}

// Stop stops the runtime side and cuts its plugins' connections; safe to
// call twice.
func (r *Runtime) Stop() {
	if r.rt == nil {
		return
	}
	r.relay.close()
	r.rt.Stop()
	r.rt = nil
}

// Synced returns once no plugin is being synchronized. Events sent
// before the runtime marks a plugin synchronized are dropped; containerd
// blocks plugin sync around RunPodSandbox, and so do the calls below.
func (r *Runtime) Synced() { r.rt.BlockPluginSync().Unblock() }

// RunPodSandbox relays the CRI call to the plugins.
func (r *Runtime) RunPodSandbox(ctx context.Context, sb *api.PodSandbox) error {
	defer r.rt.BlockPluginSync().Unblock()
	return r.rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: sb})
}

// StopPodSandbox relays the CRI call to the plugins.
func (r *Runtime) StopPodSandbox(ctx context.Context, sb *api.PodSandbox) error {
	defer r.rt.BlockPluginSync().Unblock()
	return r.rt.StopPodSandbox(ctx, &adaptation.StopPodSandboxRequest{Pod: sb})
}

// RemovePodSandbox relays the CRI call to the plugins.
func (r *Runtime) RemovePodSandbox(ctx context.Context, sb *api.PodSandbox) error {
	defer r.rt.BlockPluginSync().Unblock()
	return r.rt.RemovePodSandbox(ctx, &adaptation.RemovePodSandboxRequest{Pod: sb})
}

// CreateContainer relays the CRI call to the plugins (and its validators).
func (r *Runtime) CreateContainer(ctx context.Context, sb *api.PodSandbox, ctr *api.Container) error {
	defer r.rt.BlockPluginSync().Unblock()
	_, err := r.rt.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: sb, Container: ctr})
	return err
}

// NewPod makes a sandbox with a network namespace of its own (deleted
// when t ends); remove deletes the namespace earlier, as the runtime does
// after StopPodSandbox.
func NewPod(t testing.TB, namespace, name string) (sb *api.PodSandbox, remove func() error) {
	t.Helper()
	path, remove, err := nicsim.NewNetns("hwdra-t-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = remove() })
	return &api.PodSandbox{Id: "sb-" + name, Name: name, Namespace: namespace, Uid: "uid-pod-" + name,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "network", Path: path}}}}, remove
}

// NetnsPath is a sandbox's network namespace, "" without one.
func NetnsPath(sb *api.PodSandbox) string {
	for _, ns := range sb.GetLinux().GetNamespaces() {
		if ns.Type == "network" {
			return ns.Path
		}
	}
	return ""
}

// relay forwards connections from one unix socket to another.
type relay struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newRelay(t testing.TB, from, to string) *relay {
	t.Helper()
	os.Remove(from)
	ln, err := net.Listen("unix", from)
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", to)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return r
}

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

// NRI's logging (every plugin event, through logrus at info level) goes
// to klog, warnings and errors only. NRI keeps its logger in an
// unguarded global that every plugin stub reads when it is made (our
// plugin's too, in the tests that import this package): it is set here,
// at package initialisation, before any test goroutine exists, never
// while a stub may be reading it.
func init() { nrilog.Set(quietLogger{}) }

type quietLogger struct{}

func (quietLogger) Debugf(context.Context, string, ...any) {}
func (quietLogger) Infof(context.Context, string, ...any)  {}
func (quietLogger) Warnf(_ context.Context, f string, a ...any) {
	klog.Warningf("NRI runtime: "+f, a...)
}
func (quietLogger) Errorf(_ context.Context, f string, a ...any) {
	klog.Errorf("NRI runtime: "+f, a...)
}

// HostNetns makes a throwaway network namespace (deleted when t ends) to
// stand in for the host's, and points the mock's veth stand-ins at it
// (nicsim.VethEnv, for t). It skips t when not root.
func HostNetns(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces with veth links")
	}
	path, remove, err := nicsim.NewNetns("hwdra-t-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = remove() })
	t.Setenv(nicsim.VethEnv, path)
	return path
}

// Handle is a netlink handle in the network namespace at path, closed
// when t ends.
func Handle(t testing.TB, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}
