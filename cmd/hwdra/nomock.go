// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build nomock

package main

import "github.com/spf13/cobra"

// mockCommand: a build with -tags nomock (the agent's image) has no
// simulator and so no `hwdra mock`.
func mockCommand() *cobra.Command { return nil }
