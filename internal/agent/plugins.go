// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// metadataVersions: the newest first, so containers that read the older
// one still find it.
var metadataVersions = []schema.GroupVersion{
	{Group: "metadata.resource.k8s.io", Version: "v1beta1"},
	{Group: "metadata.resource.k8s.io", Version: "v1alpha1"},
}

// startDriver starts a driver's kubelet plugin, timed for the metrics and
// with its health stream, then has the publisher publish its pool: a pod
// placed on a published device finds its driver.
func startDriver[R any](ctx context.Context, s *server, d *Driver[R]) error {
	plugin := withHealth(observed(d, s.m, s.pub.KindOf), s.health.stream(d.Name))
	helper, err := s.startPlugin(ctx, d.Name, plugin)
	if err != nil {
		return err
	}
	d.helper = helper
	s.onStop(helper.Stop)
	s.pr.addPlugin(d.Name, registrarSocket(s.opts.RegistrarDir, d.Name, s.opts.PodUID), helper)
	s.pub.Serve(d.Name)
	return nil
}

// startPlugin registers a driver's plugin with the kubelet and serves it.
func (s *server) startPlugin(ctx context.Context, driver string, plugin kubeletplugin.DRAPlugin) (*kubeletplugin.Helper, error) {
	opts := s.opts
	// The kubelet owns the plugins directory; each driver its own
	// subdirectory (socket, metadata files).
	dataDir := filepath.Join(opts.PluginsDir, driver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, err
	}
	options := []kubeletplugin.Option{
		kubeletplugin.DriverName(driver),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.KubeClient(s.claims),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.CDIDirectory(opts.CDIDir),
		kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
		// Claims of different pods prepare concurrently; the drivers
		// lock per device.
		kubeletplugin.Serialize(false),
		// The kubelet watches our health stream (WatchHealthStatus).
		kubeletplugin.HealthService(true),
	}
	if opts.PodUID != "" {
		// Sockets named after the pod, beside those of an older pod in a
		// rolling update: neither removes the other's.
		// The library names the DRA socket dra-<pod UID>.sock, which with
		// a long kubelet root overflows a unix socket path (108 bytes):
		// the UID's first, random, 8 characters tell two pods apart.
		options = append(options, kubeletplugin.RollingUpdate(types.UID(opts.PodUID)),
			kubeletplugin.PluginSocket("dra-"+opts.PodUID[:min(8, len(opts.PodUID))]+".sock"))
	}
	helper, err := kubeletplugin.Start(ctx, plugin, options...)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin %s: %w", driver, err)
	}
	klog.FromContext(ctx).Info("Kubelet plugin started", "driver", driver)
	return helper, nil
}
