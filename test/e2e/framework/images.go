// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/hwdra/hwdra/internal/ociimage"
)

// The local images. Pods use them with imagePullPolicy: Never; there is
// no registry on the test machines.
const (
	PauseImage   = "registry.local/pause:v1"
	TestAppImage = "registry.local/hwdra-testapp:v1"
	// CUDAAppImage is a C program that loads libcuda.so.1 as CUDA
	// programs do, with this machine's glibc and nothing of NVIDIA's
	// (images/cudaapp).
	CUDAAppImage = "registry.local/hwdra-cudaapp:v1"
)

// cudaApp is CUDAAppImage's C source, module-relative.
const cudaApp = "test/e2e/images/cudaapp/cudaapp.c"

// imageSources maps each image to its Go main package (module-relative).
var imageSources = map[string]string{
	PauseImage:   "./test/e2e/images/pause",
	TestAppImage: "./test/e2e/images/testapp",
}

var (
	imagesOnce     sync.Once
	imageArchives  []string
	imagesBuildErr error
)

// buildImages compiles the image programs (static, no cgo) and wraps each in
// a one-layer OCI image archive, once per test run.
func buildImages(dir string) ([]string, error) {
	imagesOnce.Do(func() {
		imageArchives, imagesBuildErr = doBuildImages(dir)
	})
	return imageArchives, imagesBuildErr
}

func doBuildImages(dir string) ([]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var archives []string
	for ref, pkg := range imageSources {
		exe := filepath.Join(dir, filepath.Base(pkg))
		archive := exe + ".oci.tar"
		if _, err := os.Stat(archive); err == nil {
			archives = append(archives, archive) // built by the parent process
			continue
		}
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", exe, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v: %s", pkg, err, out)
		}
		if err := writeOCIArchive(archive, ref, exe); err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		archives = append(archives, archive)
	}
	archive, err := buildCUDAApp(root, dir)
	if err != nil {
		return nil, err
	}
	return append(archives, archive), nil
}

// buildCUDAApp compiles images/cudaapp with this machine's C compiler and
// wraps it with the glibc files it needs, at their paths here, in an
// image.
func buildCUDAApp(root, dir string) (string, error) {
	exe := filepath.Join(dir, "cudaapp")
	archive := exe + ".oci.tar"
	if _, err := os.Stat(archive); err == nil {
		return archive, nil // built by the parent process
	}
	if out, err := exec.Command("gcc", "-O2", "-o", exe, filepath.Join(root, cudaApp)).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v: %s", cudaApp, err, out)
	}
	prog, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	libs, err := ociimage.RuntimeFiles(exe)
	if err != nil {
		return "", err
	}
	files := append(ociimage.BaseFiles("/app"), ociimage.File{Path: "app", Mode: 0o755, Data: prog})
	files = append(files, libs...)
	if err := ociimage.WriteArchive(archive, ociimage.Image{Ref: CUDAAppImage, Files: files, Entrypoint: []string{"/app"}, Env: []string{"PATH=/"}}); err != nil {
		return "", fmt.Errorf("image %s: %w", CUDAAppImage, err)
	}
	return archive, nil
}

// BuildStandInLibcuda compiles the stand-in for the driver's libcuda
// (images/cudaapp/libcuda.c, soname libcuda.so.1) to path.
func BuildStandInLibcuda(path string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	src := filepath.Join(root, filepath.Dir(cudaApp), "libcuda.c")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", path, src).CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v: %s", src, err, out)
	}
	return nil
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := string(bytes.TrimSpace(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

// writeOCIArchive wraps a static program as /app in a one-layer image.
func writeOCIArchive(path, ref, exe string) error {
	prog, err := os.ReadFile(exe)
	if err != nil {
		return err
	}
	files := append(ociimage.BaseFiles("/app"), ociimage.File{Path: "app", Mode: 0o755, Data: prog})
	return ociimage.WriteArchive(path, ociimage.Image{Ref: ref, Files: files, Entrypoint: []string{"/app"}, Env: []string{"PATH=/"}})
}
