// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are set at build time (hack/version-ldflags.sh:
// -X main.version=0.1.0 -X main.commit=<sha>, as the image build does);
// else the version is the module version of a `go install` build or
// "devel", and the commit the one Go stamps in a git checkout, or
// "unknown" (-buildvcs=false, no .git).
var version, commit = "", ""

func versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the commit it was built from and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, commit := buildVersion()
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "hwdra %s\ncommit: %s\ngo: %s %s/%s\n", v, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}

func buildVersion() (v, c string) {
	v, c = version, commit
	info, ok := debug.ReadBuildInfo()
	if ok && v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	if v == "" {
		v = "devel"
	}
	switch {
	case c != "":
		return v, c
	case !ok:
		return v, "unknown"
	}
	c = "unknown"
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			c = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified {
		c += " (with uncommitted changes)"
	}
	return v, c
}
