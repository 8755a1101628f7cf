// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Options configure a Watcher.
type Options struct {
	// Dir is the kubelet's device-plugin directory (the kubelet's is
	// fixed: /var/lib/kubelet/device-plugins, whatever its --root-dir);
	// empty: sockets are not watched.
	Dir string
	// NodeName and Client: the node whose status is watched; a nil
	// Client: the node is not watched.
	NodeName string
	Client   kubernetes.Interface
	// Resources tells the plugin's GPU resources (config.AgentConfig).
	Resources Resources
	// Registry takes the watcher's metric.
	Registry prometheus.Registerer
}

// Resources tells the device plugin's GPU resources by name.
type Resources interface {
	DevicePluginResource(name string) bool
}

// Watcher keeps the signals of the device plugin current.
type Watcher struct {
	opts     Options
	detected *prometheus.GaugeVec

	mu       sync.Mutex
	sockets  []Signal
	node     []Signal
	synced   bool // the node's status has been read
	changed  func()
	syncedCh chan struct{}
}

// notRead stands in for the node's signals until its status is read:
// until then nobody can tell that the device plugin is away.
var notRead = Signal{Source: SourceNode, What: "(its status is not read yet)"}

// New returns a watcher that watches nothing yet (Start).
func New(opts Options) *Watcher {
	w := &Watcher{opts: opts, syncedCh: make(chan struct{}),
		detected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hwdra_device_plugin_detected",
			Help: "1 while the agent sees NVIDIA's device plugin serving GPUs on the node, by source: socket (in the kubelet's device-plugin directory) or node (its resources in the node's status).",
		}, []string{"source"}),
	}
	for _, s := range []string{SourceSocket, SourceNode} {
		w.detected.WithLabelValues(s)
	}
	opts.Registry.MustRegister(w.detected)
	if opts.Client == nil {
		w.synced = true
		close(w.syncedCh)
	}
	return w
}

// Signals are the device plugin's signs now, sockets first; none: it
// does not serve GPUs here. Until the node's status is read, that is a
// sign too.
func (w *Watcher) Signals() []Signal {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return append(slices.Clone(w.sockets), notRead)
	}
	return append(slices.Clone(w.sockets), w.node...)
}

// Why describes Signals.
func (w *Watcher) Why() []string { return describe(w.Signals()) }

// Start watches the directory and the node until ctx ends, calling
// changed (never under a lock of the watcher's) whenever the signals
// change. It returns once the directory has been read; the node's status
// comes later (WaitSynced).
func (w *Watcher) Start(ctx context.Context, changed func()) error {
	w.mu.Lock()
	w.changed = changed
	w.mu.Unlock()
	if w.opts.Dir != "" {
		if err := w.watchDir(ctx); err != nil {
			return err
		}
	}
	if w.opts.Client != nil {
		w.watchNode(ctx)
	}
	return nil
}

// WaitSynced waits until the node's status has been read (or ctx ends),
// saying so in the log while it waits.
func (w *Watcher) WaitSynced(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-w.syncedCh:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			logger.Info("Waiting to read this node's status: GPUs are published once it shows whether NVIDIA's device plugin serves them", "node", w.opts.NodeName)
		}
	}
}

// watchDir reads the directory now and again at each change in it. A
// missing directory (no kubelet device-plugin support here) is logged and
// not watched.
func (w *Watcher) watchDir(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := fw.Add(w.opts.Dir); err != nil {
		fw.Close()
		if errors.Is(err, os.ErrNotExist) {
			logger.Info("Warning: the kubelet's device-plugin directory does not exist: a device plugin's socket cannot be seen, only its resources in the node's status", "dir", w.opts.Dir)
			return nil
		}
		return err
	}
	w.scanDir(logger)
	go func() {
		defer fw.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-fw.Events:
				if !ok {
					return
				}
				if ev.Name == w.opts.Dir && ev.Has(fsnotify.Remove) {
					logger.Info("Warning: the kubelet's device-plugin directory was removed: no longer watching it", "dir", w.opts.Dir)
					w.set(logger, SourceSocket, nil)
					return
				}
			case err, ok := <-fw.Errors:
				if !ok {
					return
				}
				// An overflow loses events: read the directory again.
				logger.V(2).Info("Watching the device-plugin directory", "err", err)
			}
			w.scanDir(logger)
		}
	}()
	return nil
}

func (w *Watcher) scanDir(logger klog.Logger) {
	entries, err := os.ReadDir(w.opts.Dir)
	if err != nil {
		// Keep what was seen: a GPU offered twice is worse than one
		// offered late.
		logger.Error(err, "Reading the kubelet's device-plugin directory")
		return
	}
	w.set(logger, SourceSocket, FromSockets(w.opts.Dir, entries, w.opts.Resources.DevicePluginResource))
}

// watchNode runs an informer on this node alone.
func (w *Watcher) watchNode(ctx context.Context) {
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(w.opts.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, w.opts.NodeName).String()
		}))
	inf := factory.Core().V1().Nodes().Informer()
	seen := func(obj any) {
		if n, ok := obj.(*v1.Node); ok && n.Name == w.opts.NodeName {
			w.set(logger, SourceNode, FromNode(n, w.opts.Resources.DevicePluginResource))
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(any) { w.set(logger, SourceNode, nil) },
	})
	factory.Start(ctx.Done())
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return
		}
		w.mu.Lock()
		w.synced = true
		changed := w.changed
		w.mu.Unlock()
		close(w.syncedCh)
		logger.V(2).Info("Read the node's status", "deviceplugin", w.Why())
		if changed != nil {
			changed()
		}
	}()
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
}

// set replaces one source's signals; a change is logged, counted and
// told.
func (w *Watcher) set(logger klog.Logger, source string, signals []Signal) {
	w.mu.Lock()
	list := &w.sockets
	if source == SourceNode {
		list = &w.node
	}
	if slices.Equal(*list, signals) {
		w.mu.Unlock()
		return
	}
	*list = signals
	changed, synced := w.changed, w.synced
	w.mu.Unlock()
	v := 0.0
	if len(signals) > 0 {
		v = 1
	}
	w.detected.WithLabelValues(source).Set(v)
	logger.V(2).Info("NVIDIA's device plugin: what the node shows changed", "source", source, "signals", describe(signals))
	if changed != nil && (synced || source == SourceSocket) {
		changed()
	}
}
