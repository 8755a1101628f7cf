// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
)

func probeCommand() *cobra.Command {
	var (
		root     backend.DriverRoot
		hardware string
		output   string
	)
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Print the hardware inventory (GPUs, MIG and vGPU partitions, SR-IOV NICs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inv, err := inventory(cmd.Context(), hardware, root)
			if err != nil {
				return err
			}
			return printObject(cmd.OutOrStdout(), output, inv)
		},
	}
	addHardwareFlag(cmd, &hardware)
	addDriverRootFlags(cmd, &root)
	addOutputFlag(cmd, &output)
	return cmd
}

// inventory probes the hardware once. Devices that could not be read are
// logged and left out; only failing to open the hardware is an error.
func inventory(ctx context.Context, hardware string, root backend.DriverRoot) (hw.Inventory, error) {
	node, err := backend.OpenWith(hardware, backend.Options{DriverRoot: root})
	if err != nil {
		return hw.Inventory{}, err
	}
	defer node.Close()
	inv, err := node.Inventory(ctx)
	if err != nil {
		klog.ErrorS(err, "Some devices could not be read")
	}
	return inv, nil
}
