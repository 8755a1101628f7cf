// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/hwdra/hwdra/internal/tools/convert"
)

func convertCommand() *cobra.Command {
	var (
		files        []string
		output       string
		allowPartial bool
	)
	cmd := &cobra.Command{
		Use:   "convert [-f FILE|DIR|-]... [-o OUT] [--allow-partial]",
		Short: "Rewrite manifests written for NVIDIA's GPU DRA driver (gpu.nvidia.com) for hwdra: classes, selectors, constraints, tolerations, resource.nvidia.com configs; names on stderr what it cannot convert",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				files = []string{"-"}
			}
			inputs, err := convert.Read(files, cmd.InOrStdin())
			if err != nil {
				return err
			}
			res, err := convert.Convert(inputs)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			for _, n := range res.Notes {
				fmt.Fprintln(stderr, "note:", n)
			}
			for _, p := range res.Problems {
				fmt.Fprintln(stderr, "not converted:", p)
			}
			// Without --allow-partial, a partial conversion writes nothing:
			// the output would not do what the input did.
			if len(res.Problems) > 0 && !allowPartial {
				return fmt.Errorf("%d things not converted (named above); --allow-partial writes the rest, with those left as they were", len(res.Problems))
			}
			if output == "" || output == "-" {
				_, err = cmd.OutOrStdout().Write(res.Output)
				return err
			}
			return os.WriteFile(output, res.Output, 0o644)
		},
	}
	f := cmd.Flags()
	f.StringSliceVarP(&files, "filename", "f", nil, "manifests: YAML/JSON files, directories of them, or - for standard input, as kubectl -f takes them (repeatable); none: standard input")
	f.StringVarP(&output, "output", "o", "", "file to write the converted manifests to; empty or -: standard output")
	f.BoolVar(&allowPartial, "allow-partial", false, "write the output even where something could not be converted (named on stderr; left as it was), and exit 0")
	return cmd
}
