// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package driverlibs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// HookProgram is NVIDIA's CDI hook (github.com/NVIDIA/nvidia-container-
// toolkit/cmd/nvidia-cdi-hook): the container runtime runs it on the node
// when a container starts, to link the libraries' sonames and update the
// container's ld cache. The agent's image ships it beside the agent
// (hack/build-image.sh builds it statically, so it runs on any node).
const HookProgram = "nvidia-cdi-hook"

// InstallHook installs the hook that ships beside this program into dir,
// a folder of the node that this process sees at the same path (the
// agent's state directory), and returns its path there; a copy already
// there and equal is kept, a different one replaced atomically (a runtime
// may be running the old one). It returns "" without error where nothing
// ships beside this program (a binary run from a build, not the image).
func InstallHook(dir string) (string, error) {
	path := ShippedHook()
	if path == "" {
		return "", nil
	}
	shipped, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", HookProgram, err)
	}
	return installHook(dir, shipped)
}

// ShippedHook is the hook beside this program, "" where none ships with
// it. Run on the node itself (the lab), it is where the runtime finds it.
func ShippedHook() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	path := filepath.Join(filepath.Dir(self), HookProgram)
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	return path
}

func installHook(dir string, program []byte) (string, error) {
	dst := filepath.Join(dir, HookProgram)
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, program) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("installing %s: %w", HookProgram, err)
	}
	tmp, err := os.CreateTemp(dir, "."+HookProgram+"-")
	if err != nil {
		return "", fmt.Errorf("installing %s: %w", HookProgram, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, nothing to remove
	_, werr := tmp.Write(program)
	err = errors.Join(werr, tmp.Chmod(0o755), tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		return "", fmt.Errorf("installing %s into %s: %w", HookProgram, dir, err)
	}
	return dst, nil
}
