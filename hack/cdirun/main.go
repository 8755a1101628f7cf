// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command cdirun runs a program in a container made as a container runtime
// makes one for a pod's claims: runc's default spec, the claims' CDI
// devices injected with the CDI library that containerd and CRI-O use
// (their device nodes, mounts, environment and hooks), and a root file
// system holding only the program and the glibc files it needs, taken
// from this machine (an image that is not NVIDIA's). hwdra lab runs it
// while claims are prepared (hwdra lab ... -- cdirun ... PROGRAM):
//
//	cdirun [--cdi-dir DIR] [--devices IDS] [--runc PATH] [--keep] PROGRAM [ARG...]
//
// --cdi-dir and --devices default to the lab's HWDRA_LAB_CDI_DIR and
// HWDRA_LAB_CDI_DEVICES. The program's output is cdirun's; its exit
// status too. Needs root and runc (the one a containerd node has).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/hwdra/hwdra/internal/ociimage"
)

func main() {
	cdiDir := flag.String("cdi-dir", os.Getenv("HWDRA_LAB_CDI_DIR"), "the claims' CDI spec directory")
	devices := flag.String("devices", os.Getenv("HWDRA_LAB_CDI_DEVICES"), "the CDI devices to inject, comma-separated (gpu.hwdra.io/claim=...)")
	runc := flag.String("runc", "runc", "runc")
	keep := flag.Bool("keep", false, "keep the bundle (its config.json and root file system) for a look, and say where")
	flag.Parse()
	if flag.NArg() == 0 || *cdiDir == "" {
		fmt.Fprintln(os.Stderr, "usage: cdirun [--cdi-dir DIR] [--devices IDS] [--runc PATH] PROGRAM [ARG...]")
		os.Exit(2)
	}
	var ids []string
	if *devices != "" {
		ids = strings.Split(*devices, ",")
	}
	code, err := run(*runc, *cdiDir, ids, flag.Args(), *keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdirun:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// run makes the bundle, runs the container in it and removes it.
func run(runc, cdiDir string, ids, argv []string, keep bool) (int, error) {
	bundle, err := os.MkdirTemp("", "cdirun-")
	if err != nil {
		return 0, err
	}
	if keep {
		defer fmt.Fprintln(os.Stderr, "cdirun: the bundle is kept in", bundle)
	} else {
		defer os.RemoveAll(bundle)
	}
	if err := rootfs(filepath.Join(bundle, "rootfs"), argv[0]); err != nil {
		return 0, err
	}
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("runc spec: %v: %s", err, out)
	}
	specPath := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(specPath)
	if err != nil {
		return 0, err
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return 0, err
	}
	spec.Process.Terminal = false
	spec.Process.Args = append([]string{"/" + filepath.Base(argv[0])}, argv[1:]...)
	spec.Root.Readonly = false
	if err := inject(&spec, cdiDir, ids); err != nil {
		return 0, err
	}
	if data, err = json.Marshal(&spec); err != nil {
		return 0, err
	}
	if err := os.WriteFile(specPath, data, 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command(runc, "run", "--bundle", bundle, filepath.Base(bundle))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	return 0, err
}

// inject applies the CDI devices to spec as the runtime does.
func inject(spec *oci.Spec, dir string, ids []string) error {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("CDI specs in %s: %w", dir, err)
	}
	if len(ids) == 0 {
		return nil
	}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		return fmt.Errorf("CDI devices %v (unresolved %v): %w", ids, unresolved, err)
	}
	return nil
}

// rootfs writes a root file system with the program at /<its name> and
// the glibc files it needs, at their paths on this machine.
func rootfs(dir, program string) error {
	data, err := os.ReadFile(program)
	if err != nil {
		return err
	}
	libs, err := ociimage.RuntimeFiles(program)
	if err != nil {
		return err
	}
	files := append(ociimage.BaseFiles("/"+filepath.Base(program)), ociimage.File{Path: filepath.Base(program), Mode: 0o755, Data: data})
	for _, d := range []string{"proc", "sys", "dev"} {
		files = append(files, ociimage.File{Path: d, Mode: 0o755, Dir: true})
	}
	for _, f := range append(files, libs...) {
		path := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		switch {
		case f.Dir:
			err = os.MkdirAll(path, os.FileMode(f.Mode))
		case f.Link != "":
			err = os.Symlink(f.Link, path)
		default:
			err = os.WriteFile(path, f.Data, os.FileMode(f.Mode))
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}
