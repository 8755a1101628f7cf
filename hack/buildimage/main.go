// Command buildimage writes the agent's image archive (hack/build-image.sh
// builds the binary and calls it): the hwdra binary as /hwdra, the glibc
// files it needs at run time taken from this machine, the PCI IDs database
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
	binary := flag.String("binary", "", "the hwdra binary (cgo, dynamically linked against glibc)")
	ref := flag.String("ref", "", "image reference, <registry>/<name>:<tag>")
	out := flag.String("out", "", "archive to write")
	dlopened := flag.String("dlopened", nvmlDeps, "comma-separated libraries loaded at run time whose dependencies resolve in the image")
	pciIDs := flag.String("pci-ids", "/usr/share/misc/pci.ids", "the PCI IDs database to put in the image (Debian's pci.ids package); missing: GPUs bound to vfio-pci are named by their device ID")
	var beside []string
	flag.Func("beside", "a static program to ship beside /hwdra, under its own name (repeatable)", func(path string) error {
		beside = append(beside, path)
		return nil
	})
	flag.Parse()
	if *binary == "" || *ref == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: buildimage --binary FILE --ref REGISTRY/NAME:TAG --out FILE")
		os.Exit(2)
	}
	if err := run(*binary, *ref, *out, *pciIDs, strings.Split(*dlopened, ","), beside); err != nil {
		fmt.Fprintln(os.Stderr, "buildimage:", err)
		os.Exit(1)
	}
}

func run(binary, ref, out, pciIDs string, dlopened, beside []string) error {
	prog, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	libs, err := ociimage.RuntimeFiles(binary, dlopened...)
	if err != nil {
		return err
	}
	files := append(ociimage.BaseFiles("/hwdra"), ociimage.File{Path: "hwdra", Mode: 0o755, Data: prog})
	files = append(files, libs...)
	for _, path := range beside {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, ociimage.File{Path: filepath.Base(path), Mode: 0o755, Data: data})
	}
	if db, err := os.ReadFile(pciIDs); err == nil {
		for _, dir := range []string{"usr", "usr/share", "usr/share/misc"} {
			if !slices.ContainsFunc(files, func(f ociimage.File) bool { return f.Path == dir }) {
				files = append(files, ociimage.File{Path: dir, Mode: 0o755, Dir: true})
			}
		}
		files = append(files, ociimage.File{Path: "usr/share/misc/pci.ids", Mode: 0o644, Data: db})
	} else {
		fmt.Fprintf(os.Stderr, "buildimage: no PCI IDs database (%v): GPUs bound to vfio-pci will be named by device ID\n", err)
	}
	return ociimage.WriteArchive(out, ociimage.Image{
		Ref:        ref,
		Files:      files,
		Entrypoint: []string{"/hwdra"},
		Env:        []string{"PATH=/"},
	})
}
