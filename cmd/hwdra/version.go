package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time (-ldflags "-X main.version=v0.3.0"); else
// the module version of a `go install` build, or "devel".
var version = ""

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

func buildVersion() (v, commit string) {
	v, commit = version, "unknown"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v, commit
	}
	if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	if v == "" {
		v = "devel"
	}
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified {
		commit += " (with uncommitted changes)"
	}
	return v, commit
}
