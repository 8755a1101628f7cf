// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command hwdra is the hwdra node agent and its tools.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	logsapi "k8s.io/component-base/logs/api/v1"
)

func main() {
	// SIGTERM (the kubelet stopping the DaemonSet pod) cancels the context:
	// the agent stops its plugins cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	root := newRootCommand()
	root.SetContext(ctx)
	// Errors as plain lines for people, not as log events.
	if err := cli.RunNoErrOutput(root); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	logs := logsapi.NewLoggingConfiguration()
	root := &cobra.Command{
		Use:   "hwdra",
		Short: "Kubernetes DRA node agent for NVIDIA GPUs and SR-IOV NICs",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return logsapi.ValidateAndApply(logs, nil)
		},
	}
	logsapi.AddFlags(logs, root.PersistentFlags())
	root.AddCommand(agentCommand(), labCommand(), probeCommand(), slicesCommand(), poolStatusCommand(), doctorCommand(), convertCommand(), versionCommand())
	if mock := mockCommand(); mock != nil {
		root.AddCommand(mock)
	}
	return root
}
