// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !nolab

package main

import (
	"github.com/spf13/cobra"

	"github.com/hwdra/hwdra/internal/tools/lab"
)

func labCommand() *cobra.Command {
	var opts lab.Options
	cmd := &cobra.Command{
		Use:   "lab --claim FILE|DIR... [FILE|DIR...] [-- COMMAND [ARG...]]",
		Short: "Without a cluster: probe, publish, allocate claims with the scheduler's allocator, prepare them for real, show the result, unprepare",
		RunE: func(cmd *cobra.Command, args []string) error {
			// "--claim a.yaml b.yaml": the shell's glob expands after one
			// flag. After "--": the command to run while they are prepared.
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				args, opts.Exec = args[:dash], args[dash:]
			}
			opts.ClaimFiles = append(opts.ClaimFiles, args...)
			opts.Stdin = cmd.InOrStdin()
			if err := makeDirs(cmd.Flags(), "state-dir", "cdi-dir"); err != nil {
				return err
			}
			// The first SIGINT or SIGTERM cancels cmd.Context() (main): the
			// lab undoes what it prepared, to the end, whatever follows.
			defer lab.NoteRepeatedSignals(cmd.Context(), cmd.OutOrStdout())()
			return lab.Run(cmd.Context(), cmd.OutOrStdout(), opts)
		},
	}
	f := cmd.Flags()
	addHardwareFlag(cmd, &opts.Hardware)
	f.StringSliceVar(&opts.ClaimFiles, "claim", nil, "YAML/JSON files, directories of them, or - for standard input, as kubectl -f takes them (repeatable, comma-separated; deploy/examples has claims): ResourceClaims and ResourceClaimTemplates (v1, v1beta1, v1beta2), Pods and the pods of workloads with the claims they name and the extended resources they ask for; other kinds are skipped, each said. Each pod's claims are allocated together, and each file's claims that no pod names, beside those before them")
	f.StringVar(&opts.ConfigPath, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults")
	f.StringSliceVar(&opts.ValuesFiles, "values", nil, "the Helm chart's values files (repeatable, comma-separated, later over earlier, as helm's --values): allocate with the DeviceClasses deploy/helm/hwdra renders with these values (extendedResources: nvidia.com/gpu.shared, nvidia.com/mig-*) instead of its defaults; values the chart refuses stop the run")
	f.BoolVar(&opts.Keep, "keep", false, "leave the claims prepared instead of unpreparing them at the end (where every claim prepared: a failed or interrupted run is undone); it prints the command that undoes them, hwdra lab undo STATE-DIR")
	f.StringVar(&opts.CDIHook, "nvidia-cdi-hook", "", "nvidia-cdi-hook for the hooks of the driver files generated for containers (an installed NVIDIA Container Toolkit's); empty: the one beside hwdra, if any")
	f.StringVar(&opts.StateDir, "state-dir", "", "checkpoint directory (default: a temporary one)")
	f.StringVar(&opts.CDIDir, "cdi-dir", "", "directory for CDI specs (default: a temporary one)")
	cmd.AddCommand(labUndoCommand())
	return cmd
}

func labUndoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "undo STATE-DIR",
		Short: "Undo what a lab run left prepared (--keep, or an undo that could not finish): the directory it named; works after its mock hardware is gone (ends the MPS daemons it started)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			defer lab.NoteRepeatedSignals(cmd.Context(), cmd.OutOrStdout())()
			return lab.Undo(cmd.Context(), cmd.OutOrStdout(), args[0])
		},
	}
}
