// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build nolab

package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// labCommand, in a build with -tags nolab (the agent's image,
// hack/build-image.sh), only says where the lab is: it pulls in the
// scheduler's allocator and CEL, which the node agent never runs.
func labCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "lab",
		Short:              "Not in this build (-tags nolab): run the lab from a full build, go run ./cmd/hwdra lab ...",
		DisableFlagParsing: true,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("this hwdra was built without the lab (-tags nolab, as in the agent's image): run `go run ./cmd/hwdra lab ...` from the repository")
		},
	}
}
