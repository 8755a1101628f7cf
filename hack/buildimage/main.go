// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command buildimage writes the agent's image archive (hack/build-image.sh
// builds the binaries and calls it), one image per architecture under one
// index: the hwdra binary as /hwdra, the glibc files it needs at run time
// (this machine's, or the cross toolchain's for another architecture),
// the PCI IDs database
// (names of GPUs bound to vfio-pci), the static programs it ships beside
// itself (nvidia-cdi-hook, which it installs on the node), and nothing
// more.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hwdra/hwdra/internal/ociimage"
)

// nvmlDeps are the libraries the host's libnvidia-ml.so.1 links against
// (readelf -d: libpthread.so.0, libm.so.6, libdl.so.2, librt.so.1, libc):
// the agent dlopens NVML from the host's driver root, but the dynamic
// loader resolves NVML's own dependencies in the image, so they must be
// here, from the same glibc as the loader. The binary itself needs only
// libc.so.6 and the loader (cgo, for go-nvml).
const nvmlDeps = "libm.so.6,libdl.so.2,libpthread.so.0,librt.so.1"

func main() {
	ref := flag.String("ref", "", "image reference, <registry>/<name>:<tag>")
	out := flag.String("out", "", "archive to write")
	dlopened := flag.String("dlopened", nvmlDeps, "comma-separated libraries loaded at run time whose dependencies resolve in the image")
	pciIDs := flag.String("pci-ids", "/usr/share/misc/pci.ids", "the PCI IDs database to put in the image (Debian's pci.ids package); missing: GPUs bound to vfio-pci are named by their device ID")
	var dirs, beside []string
	flag.Func("platform-dir", "a directory with one architecture's hwdra binary (cgo, dynamically linked against glibc) and the programs named by --beside (repeatable: one image per architecture, under one index)", func(dir string) error {
		dirs = append(dirs, dir)
		return nil
	})
	flag.Func("beside", "a static program in each platform directory to ship beside /hwdra, under its own name (repeatable)", func(name string) error {
		beside = append(beside, name)
		return nil
	})
	flag.Parse()
	if len(dirs) == 0 || *ref == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: buildimage --platform-dir DIR [--platform-dir DIR] [--beside NAME] --ref REGISTRY/NAME:TAG --out FILE")
		os.Exit(2)
	}
	var imgs []ociimage.Image
	for _, dir := range dirs {
		img, err := image(dir, *ref, *pciIDs, strings.Split(*dlopened, ","), beside)
		if err != nil {
			fmt.Fprintf(os.Stderr, "buildimage: %s: %v\n", dir, err)
			os.Exit(1)
		}
		imgs = append(imgs, img)
	}
	if err := ociimage.WriteArchive(*out, imgs...); err != nil {
		fmt.Fprintln(os.Stderr, "buildimage:", err)
		os.Exit(1)
	}
}

// image is one architecture's image: that of dir's hwdra binary, with
// that architecture's glibc files.
func image(dir, ref, pciIDs string, dlopened, beside []string) (ociimage.Image, error) {
	binary := filepath.Join(dir, "hwdra")
	arch, err := ociimage.Arch(binary)
	if err != nil {
		return ociimage.Image{}, err
	}
	prog, err := os.ReadFile(binary)
	if err != nil {
		return ociimage.Image{}, err
	}
	libs, err := ociimage.RuntimeFiles(binary, dlopened...)
	if err != nil {
		return ociimage.Image{}, err
	}
	files := append(ociimage.BaseFiles("/hwdra"), ociimage.File{Path: "hwdra", Mode: 0o755, Data: prog})
	files = append(files, libs...)
	for _, name := range beside {
		path := filepath.Join(dir, name)
		if a, err := ociimage.Arch(path); err != nil || a != arch {
			return ociimage.Image{}, fmt.Errorf("%s: want an %s program beside %s (%s, %v)", path, arch, binary, a, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return ociimage.Image{}, err
		}
		files = append(files, ociimage.File{Path: name, Mode: 0o755, Data: data})
	}
	if db, err := os.ReadFile(pciIDs); err == nil {
		for _, d := range []string{"usr", "usr/share", "usr/share/misc"} {
			if !slices.ContainsFunc(files, func(f ociimage.File) bool { return f.Path == d }) {
				files = append(files, ociimage.File{Path: d, Mode: 0o755, Dir: true})
			}
		}
		files = append(files, ociimage.File{Path: "usr/share/misc/pci.ids", Mode: 0o644, Data: db})
	} else {
		fmt.Fprintf(os.Stderr, "buildimage: no PCI IDs database (%v): GPUs bound to vfio-pci will be named by device ID\n", err)
	}
	return ociimage.Image{
		Ref:        ref,
		Arch:       arch,
		Files:      files,
		Entrypoint: []string{"/hwdra"},
		Env:        []string{"PATH=/"},
	}, nil
}
