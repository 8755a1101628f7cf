// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/hwdra/hwdra/internal/tools/poolstatus"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

func poolStatusCommand() *cobra.Command {
	var (
		kubeconfig, node, output string
		drivers                  []string
	)
	cmd := &cobra.Command{
		Use:   "pool-status",
		Short: "Report the drivers' resource pools from the cluster's slices and claims: devices allocated and available, MIG profiles that still fit per GPU, bandwidth left per PF",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "yaml" && output != "json" {
				return fmt.Errorf("--output %q: want table, yaml or json", output)
			}
			rc, source, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			rc.UserAgent = "hwdra-pool-status"
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			r, err := poolstatus.Status(cmd.Context(), client, drivers, node)
			if err != nil {
				return fmt.Errorf("API server %s (%s): %w", rc.Host, source, err)
			}
			if output == "table" {
				return poolstatus.WriteTable(cmd.OutOrStdout(), r)
			}
			return printObject(cmd.OutOrStdout(), output, r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, or the pod's service account (in-cluster)")
	f.StringSliceVar(&drivers, "driver", []string{device.GPUDriver, device.NICDriver}, "drivers whose pools to report")
	f.StringVar(&node, "node", "", "report only this node's pools; empty: every node")
	f.StringVarP(&output, "output", "o", "table", "output format: table, yaml or json")
	return cmd
}
