// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"sort"

	"github.com/hwdra/hwdra/internal/backend"

	"github.com/spf13/cobra"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

func slicesCommand() *cobra.Command {
	var (
		root                                   backend.DriverRoot
		hardware, output, nodeName, configPath string
	)
	cmd := &cobra.Command{
		Use:   "slices",
		Short: "Print the ResourceSlices the agent would publish for this node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nodeName == "" {
				return fmt.Errorf("--node-name is required")
			}
			cfg, err := config.Load(configPath)
			if err != nil {
				return err
			}
			inv, err := inventory(cmd.Context(), hardware, root)
			if err != nil {
				return err
			}
			// The GPUs a split configuration leaves to NVIDIA's device
			// plugin (whether it runs is only known on the node).
			own, left, why := cfg.OwnGPUs(inv.GPUs, false)
			if len(left) > 0 {
				klog.InfoS("GPUs not published", "count", len(left), "reason", why)
			}
			inv.GPUs = own
			res, skipped := resources.ForNode(nodeName, inv, cfg, device.AllFeatures, hw.Health{})
			for _, s := range skipped {
				klog.InfoS("PF not offered", "pf", s.String())
			}
			drivers := make([]string, 0, len(res))
			for d := range res {
				drivers = append(drivers, d)
			}
			sort.Strings(drivers)
			var objs []resourceapi.ResourceSlice
			for _, d := range drivers {
				objs = append(objs, resources.Objects(d, nodeName, res[d])...)
			}
			return printList(cmd.OutOrStdout(), output, objs)
		},
	}
	addHardwareFlag(cmd, &hardware)
	addDriverRootFlags(cmd, &root)
	addOutputFlag(cmd, &output)
	cmd.Flags().StringVar(&nodeName, "node-name", "", "name of the Node the slices belong to")
	cmd.Flags().StringVar(&configPath, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults")
	return cmd
}
