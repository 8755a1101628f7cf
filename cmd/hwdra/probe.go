package main

import (
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/backend"
)

func probeCommand() *cobra.Command {
	var (
		hardware string
		output   string
	)
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Print the hardware inventory (GPUs, MIG and vGPU partitions, SR-IOV NICs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			node, err := backend.Open(hardware)
			if err != nil {
				return err
			}
			defer node.Close()
			inv, err := node.Inventory(cmd.Context())
			if err != nil {
				klog.ErrorS(err, "Some devices could not be read")
			}
			return printObject(cmd.OutOrStdout(), output, inv)
		},
	}
	addHardwareFlag(cmd, &hardware)
	addOutputFlag(cmd, &output)
	return cmd
}
