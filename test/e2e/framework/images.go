package framework

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// The two local images. Pods use them with imagePullPolicy: Never; there is
// no registry on the test machines.
const (
	PauseImage   = "registry.local/pause:v1"
	TestAppImage = "registry.local/hwdra-testapp:v1"
)

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
	return archives, nil
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

// layerTar is the image's only layer: the program as /app plus the few files
// a container runtime expects (passwd for user lookup, a writable /tmp).
func layerTar(exe string) ([]byte, error) {
	prog, err := os.ReadFile(exe)
	if err != nil {
		return nil, err
	}
	mtime := time.Unix(0, 0)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		data []byte
	}{
		{"etc/", 0o755, nil},
		{"tmp/", 0o1777, nil},
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/:/app\nnobody:x:65534:65534:nobody:/:/app\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")},
		{"app", 0o755, prog},
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: mtime, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.data == nil {
			hdr.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

func describe(mediaType string, blob []byte) descriptor {
	sum := sha256.Sum256(blob)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: len(blob)}
}

// writeOCIArchive writes an OCI image layout as a tar archive, the format
// `ctr images import` reads; the index annotation names the image.
func writeOCIArchive(path, ref, exe string) error {
	layer, err := layerTar(exe)
	if err != nil {
		return err
	}
	layerDesc := describe("application/vnd.oci.image.layer.v1.tar", layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{"/app"}, "Env": []string{"PATH=/"}, "WorkingDir": "/"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	configDesc := describe("application/vnd.oci.image.config.v1+json", config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	manifestDesc := describe("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": ref[strings.LastIndex(ref, ":")+1:],
	}
	manifestDesc.Platform = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []descriptor{manifestDesc},
	})

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
	}
	for _, b := range [][]byte{layer, config, manifest} {
		d := describe("", b)
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + d.Digest[len("sha256:"):], b})
	}
	for _, file := range files {
		hdr := &tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: time.Unix(0, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(file.data); err != nil {
			return err
		}
	}
	return tw.Close()
}
