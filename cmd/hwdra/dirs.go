// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/hwdra/hwdra/internal/agent/podnet"
)

// nodePaths are the node's directories and the NRI socket the agent
// uses. The agent takes them as flags and doctor checks them under the
// same names and defaults, so both are registered here once.
type nodePaths struct{ registrar, plugins, cdi, state, nri *string }

// addNodePathFlags registers the node paths' flags; also is appended to
// each flag's help (doctor's "as the agent's flag").
func addNodePathFlags(f *pflag.FlagSet, p nodePaths, also string) {
	f.StringVar(p.registrar, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory"+also)
	f.StringVar(p.plugins, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "directory for the drivers' sockets and metadata (one subdirectory per driver)"+also)
	f.StringVar(p.cdi, "cdi-dir", "/var/run/cdi", "directory for CDI specs, as configured in the container runtime"+also)
	f.StringVar(p.state, "state-dir", "/var/lib/hwdra", "directory for checkpoints"+also)
	f.StringVar(p.nri, "nri-socket", podnet.DefaultSocket, "the container runtime's NRI socket, for moving VF netdevs into pods; empty: no NRI (VFs stay in the host network namespace)"+also)
}

// makeDirs creates the directories the named flags give (an empty value
// leaves the command's default), so that a path that cannot be a
// directory fails at start, naming the flag, not later as a bare mkdir or
// socket error.
func makeDirs(flags *pflag.FlagSet, names ...string) error {
	for _, name := range names {
		dir := flags.Lookup(name).Value.String()
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--%s %s: %s", name, dir, whyNoDir(dir, err))
		}
	}
	return nil
}

// needDirs checks that the directories the named flags give exist: ones
// another program (the kubelet) makes.
func needDirs(flags *pflag.FlagSet, names ...string) error {
	for _, name := range names {
		dir := flags.Lookup(name).Value.String()
		st, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("--%s %s: no such directory (the kubelet makes it: is this the kubelet's, and is it mounted?)", name, dir)
		case err != nil:
			return fmt.Errorf("--%s %s: %s", name, dir, whyNoDir(dir, err))
		case !st.IsDir():
			return fmt.Errorf("--%s %s: not a directory", name, dir)
		}
	}
	return nil
}

// whyNoDir says why dir is no directory: which part of it is a file, or
// the system's reason without the operation's name.
func whyNoDir(dir string, err error) string {
	for p := dir; p != filepath.Dir(p); p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return fmt.Sprintf("%s is a file, not a directory", p)
		}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s: %v", pe.Path, pe.Err)
	}
	return err.Error()
}
