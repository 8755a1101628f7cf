// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

func readTar(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header, []string) {
	t.Helper()
	files, hdrs := map[string][]byte{}, map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, hdrs, order
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[hdr.Name], hdrs[hdr.Name] = data, hdr
		order = append(order, hdr.Name)
	}
}

// TestArchive: a valid OCI layout whose blobs match their digests, whose
// index names the image (ctr images import), and Docker's manifest.json
// naming the same config and layer (docker load); the layer holds the
// files, links and directories, parents first.
func TestArchive(t *testing.T) {
	const ref = "registry.local/app:v1"
	files := append(BaseFiles("/app"),
		File{Path: "app", Mode: 0o755, Data: []byte("#!/bin/true\n")},
		File{Path: "lib64", Link: "usr/lib64"},
		File{Path: "usr", Mode: 0o755, Dir: true},
	)
	path, blobs := writeArchive(t, Image{Ref: ref, Files: files, Entrypoint: []string{"/app"}})
	if _, ok := blobs["oci-layout"]; !ok {
		t.Fatal("no oci-layout")
	}
	for name, data := range blobs {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && d != "" {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s has digest %x", name, sum)
			}
		}
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index: %v %s", err, blobs["index.json"])
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != ref || m.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("annotations %v", m.Annotations)
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(blobs["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")], &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(blobs["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json: %v %s", err, blobs["manifest.json"])
	}
	if d := docker[0]; d.Config != "blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:") ||
		len(d.Layers) != 1 || d.Layers[0] != "blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:") ||
		len(d.RepoTags) != 1 || d.RepoTags[0] != ref {
		t.Errorf("manifest.json %+v does not name the OCI manifest's blobs %+v", d, manifest)
	}
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
		Config struct{ Entrypoint []string }
	}
	if err := json.Unmarshal(blobs[docker[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	layer := gunzip(t, blobs[docker[0].Layers[0]])
	if sum := sha256.Sum256(layer); len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != "sha256:"+hex.EncodeToString(sum[:]) ||
		config.Config.Entrypoint[0] != "/app" || manifest.Layers[0].MediaType != mediaLayer {
		t.Errorf("config %+v, layer %+v: want the uncompressed layer's digest as its diff ID", config, manifest.Layers[0])
	}
	content, hdrs, order := readTar(t, bytes.NewReader(layer))
	if string(content["app"]) != "#!/bin/true\n" || hdrs["app"].Mode != 0o755 {
		t.Errorf("app: %q mode %o", content["app"], hdrs["app"].Mode)
	}
	if h := hdrs["lib64"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/lib64" {
		t.Errorf("lib64: %+v", h)
	}
	if h := hdrs["tmp/"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Errorf("tmp: %+v", h)
	}
	if order[0] != "app" || indexOf(order, "etc/") > indexOf(order, "etc/passwd") {
		t.Errorf("layer order %v", order)
	}
	// Same inputs, same bytes.
	again := filepath.Join(t.TempDir(), "again.tar")
	if err := WriteArchive(again, Image{Ref: ref, Files: files, Entrypoint: []string{"/app"}}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two archives of the same image differ")
	}
}

// writeArchive writes imgs to an archive and returns its path and entries.
func writeArchive(t *testing.T, imgs ...Image) (string, map[string][]byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := WriteArchive(path, imgs...); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs, _, _ := readTar(t, f)
	return path, blobs
}

func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArchivePlatforms: images of two architectures under one reference
// make one archive whose index names an image index (what ctr imports per
// platform and a registry push takes whole), each manifest with its
// platform and its config's architecture; docker load's manifest.json
// names this machine's. One reference, one image per architecture.
func TestArchivePlatforms(t *testing.T) {
	const ref = "registry.local/app:v2"
	img := func(arch, content string) Image {
		return Image{Ref: ref, Arch: arch, Files: []File{{Path: "app", Mode: 0o755, Data: []byte(content)}}, Entrypoint: []string{"/app"}}
	}
	_, blobs := writeArchive(t, img("arm64", "arm"), img("amd64", "x86"))
	read := func(d descriptor, v any) {
		t.Helper()
		data, ok := blobs["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if !ok || len(data) != d.Size {
			t.Fatalf("blob %s: missing or not %d bytes", d.Digest, d.Size)
		}
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatal(err)
		}
	}
	var top struct{ Manifests []descriptor }
	if err := json.Unmarshal(blobs["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, blobs["index.json"])
	}
	if d := top.Manifests[0]; d.MediaType != mediaIndex || d.Annotations["io.containerd.image.name"] != ref {
		t.Fatalf("index.json names %+v, want an image index named %s", d, ref)
	}
	var index struct{ Manifests []descriptor }
	read(top.Manifests[0], &index)
	archs := map[string]string{}
	for _, m := range index.Manifests {
		var manifest struct {
			Config descriptor
			Layers []descriptor
		}
		read(m, &manifest)
		var config struct{ Architecture string }
		read(manifest.Config, &config)
		if m.Platform["architecture"] != config.Architecture || m.Platform["os"] != "linux" {
			t.Errorf("manifest platform %v, config architecture %s", m.Platform, config.Architecture)
		}
		content, _, _ := readTar(t, bytes.NewReader(gunzip(t, blobs["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")])))
		archs[config.Architecture] = string(content["app"])
	}
	if len(archs) != 2 || archs["arm64"] != "arm" || archs["amd64"] != "x86" {
		t.Errorf("platforms %v, want arm64: arm, amd64: x86", archs)
	}
	var docker []struct{ Config string }
	if err := json.Unmarshal(blobs["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json: %v", err)
	}
	var config struct{ Architecture string }
	if err := json.Unmarshal(blobs[docker[0].Config], &config); err != nil || config.Architecture != runtime.GOARCH {
		t.Errorf("manifest.json names the %s image (%v), want this machine's %s", config.Architecture, err, runtime.GOARCH)
	}

	other := img("arm64", "x")
	other.Ref = "registry.local/app:v3"
	for name, imgs := range map[string][]Image{
		"two references":         {img("amd64", "a"), other},
		"one architecture twice": {img("amd64", "a"), img("amd64", "b")},
		"none":                   nil,
	} {
		if err := WriteArchive(filepath.Join(t.TempDir(), "x.tar"), imgs...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestArchiveRefusesShortReferences(t *testing.T) {
	for _, ref := range []string{"hwdra:v1", "registry.local/hwdra", "hwdra"} {
		if err := WriteArchive(filepath.Join(t.TempDir(), "x.tar"), Image{Ref: ref}); err == nil {
			t.Errorf("%q: no error", ref)
		}
	}
}

// TestRuntimeFiles: a dynamically linked program gets its loader (through
// the links on its path) and libc; a dlopened library comes with its
// dependencies.
func TestRuntimeFiles(t *testing.T) {
	exe := "/bin/ls"
	interp, _, err := elfDeps(exe)
	if err != nil || interp == "" {
		t.Skipf("%s is not a dynamically linked ELF program here (%v)", exe, err)
	}
	files, err := RuntimeFiles(exe, "libm.so.6")
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	want := []string{strings.TrimPrefix(interp, "/")}
	for _, lib := range []string{"libc.so.6", "libm.so.6"} {
		p, err := findLibrary(runtime.GOARCH, lib)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, strings.TrimPrefix(p, "/"))
	}
	for _, w := range want {
		f, err := resolve(byPath, w)
		if err != nil {
			t.Errorf("%s: %v (image has %d files)", w, err, len(files))
			continue
		}
		if f.Dir || len(f.Data) == 0 {
			t.Errorf("%s: no file content", w)
		}
	}
}

// resolve looks a path up in the image as the loader would, following the
// symbolic links on its way.
func resolve(byPath map[string]File, path string) (File, error) {
	parts := strings.Split(path, "/")
	cur := ""
	for hops := 0; len(parts) > 0; {
		next := filepath.Join(cur, parts[0])
		f, ok := byPath[next]
		if !ok {
			return File{}, fmt.Errorf("%s not in the image", next)
		}
		parts = parts[1:]
		if f.Link == "" {
			if len(parts) == 0 {
				return f, nil
			}
			cur = next
			continue
		}
		if hops++; hops > 8 {
			return File{}, fmt.Errorf("too many links")
		}
		target := f.Link
		if !filepath.IsAbs(target) {
			target = filepath.Join("/"+cur, target)
		}
		parts = append(strings.Split(strings.TrimPrefix(target, "/"), "/"), parts...)
		cur = ""
	}
	return File{}, fmt.Errorf("empty path")
}

// TestRuntimeFilesRun: a dynamically linked program runs in a root that
// holds only it and its RuntimeFiles, as in a container of the image
// (root only: chroot).
func TestRuntimeFilesRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot)")
	}
	exe := "/bin/ls"
	if interp, _, err := elfDeps(exe); err != nil || interp == "" {
		t.Skipf("%s is not a dynamically linked ELF program here (%v)", exe, err)
	}
	prog, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := RuntimeFiles(exe)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	unpack(t, root, append(append(BaseFiles("/prog"), File{Path: "prog", Mode: 0o755, Data: prog}), libs...))
	cmd := exec.Command("/prog", "/")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the program in its image root: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "prog") {
		t.Errorf("ls / in the image root: %q, want prog among it", out)
	}
}

// TestRuntimeFilesCross: a program cross-compiled for arm64 gets the cross
// toolchain's loader and libraries where an arm64 loader looks, and runs
// (under qemu-user, with the image's root as its root) from them alone.
func TestRuntimeFilesCross(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the cross check builds arm64 on amd64")
	}
	cc, err := exec.LookPath("aarch64-linux-gnu-gcc")
	if err != nil {
		t.Skip("no arm64 cross compiler (Debian: apt-get install gcc-aarch64-linux-gnu)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "hello.c")
	if err := os.WriteFile(src, []byte("#include <stdio.h>\nint main(void) { printf(\"hello %d\\n\", 2); return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "hello")
	if out, err := exec.Command(cc, "-o", exe, src).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	if arch, err := Arch(exe); err != nil || arch != "arm64" {
		t.Fatalf("Arch(%s) = %q, %v", exe, arch, err)
	}
	files, err := RuntimeFiles(exe, "libm.so.6", "librt.so.1")
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]File{}
	for _, f := range files {
		byPath[f.Path] = f
	}
	for _, want := range []string{"lib/ld-linux-aarch64.so.1", "usr/lib/aarch64-linux-gnu/libc.so.6", "usr/lib/aarch64-linux-gnu/libm.so.6", "usr/lib/aarch64-linux-gnu/librt.so.1"} {
		if f, ok := byPath[want]; !ok || len(f.Data) == 0 {
			t.Errorf("%s not in the image's files", want)
		} else if arch, _ := elfMachineOf(f.Data); arch != "arm64" {
			t.Errorf("%s: %s, want arm64", want, arch)
		}
	}
	qemu, err := exec.LookPath("qemu-aarch64")
	if err != nil {
		t.Skip("no qemu-aarch64 (Debian: apt-get install qemu-user): the image's files are not run")
	}
	root := t.TempDir()
	prog, _ := os.ReadFile(exe)
	unpack(t, root, append(files, File{Path: "prog", Mode: 0o755, Data: prog}))
	out, err := exec.Command(qemu, "-L", root, filepath.Join(root, "prog")).CombinedOutput()
	if err != nil || string(out) != "hello 2\n" {
		t.Fatalf("the arm64 program from the image's files under qemu: %v: %q", err, out)
	}
}

func elfMachineOf(data []byte) (string, error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("ociimage-elf-%d", os.Getpid()))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", err
	}
	defer os.Remove(path)
	return Arch(path)
}

// unpack writes files into root as a container runtime unpacks a layer.
func unpack(t *testing.T, root string, files []File) {
	t.Helper()
	layer, err := Layer(files)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(hdr.Mode))
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, p)
		default:
			data, _ := io.ReadAll(tr)
			err = os.WriteFile(p, data, os.FileMode(hdr.Mode))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
