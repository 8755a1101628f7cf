// Package ociimage writes container images as tar archives without a
// registry or a container engine: an OCI image layout (what `ctr images
// import` reads) that also carries Docker's manifest.json (what `docker
// load` reads, before and after Docker 25), with one uncompressed layer.
// The agent's image (hack/build-image.sh) and the real-node suite's test
// images are written with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"
)

// File is one entry of the image's layer: a regular file (Data), a
// directory (Dir) or a symbolic link (Link). Path is relative to the
// image's root ("etc/passwd").
type File struct {
	Path string
	Mode int64
	Data []byte
	Dir  bool
	Link string
}

// Image is what goes into an archive.
type Image struct {
	// Ref is the full reference the image is imported as
	// ("registry.local/pause:v1"): fully qualified, since the kubelet
	// looks "hwdra:v1" up as docker.io/library/hwdra:v1.
	Ref        string
	Files      []File
	Entrypoint []string
	Env        []string
}

// BaseFiles are what a container runtime expects of any image: passwd and
// group for user lookup, a writable /tmp.
func BaseFiles(shell string) []File {
	return []File{
		{Path: "etc", Mode: 0o755, Dir: true},
		{Path: "tmp", Mode: 0o1777, Dir: true},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:" + shell + "\nnobody:x:65534:65534:nobody:/:" + shell + "\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
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

// epoch is every entry's modification time: the same inputs give the same
// archive, digests included.
var epoch = time.Unix(0, 0)

// Layer is the image's layer as a tar stream, entries sorted by path so
// that directories come before what they hold.
func Layer(files []File) ([]byte, error) {
	sorted := append([]File(nil), files...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, f := range sorted {
		name := strings.TrimPrefix(f.Path, "/")
		if name == "" || seen[name] {
			if seen[name] {
				return nil, fmt.Errorf("image file %s given twice", name)
			}
			continue
		}
		seen[name] = true
		hdr := &tar.Header{Name: name, Mode: f.Mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.Data))}
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name, hdr.Size = tar.TypeDir, name+"/", 0
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size, hdr.Mode = tar.TypeSymlink, f.Link, 0, 0o777
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img to path.
func WriteArchive(path string, img Image) error {
	colon := strings.LastIndex(img.Ref, ":")
	if colon < 0 || strings.Contains(img.Ref[colon:], "/") || !strings.Contains(img.Ref[:colon], "/") {
		return fmt.Errorf("image reference %q: want <registry>/<name>:<tag>", img.Ref)
	}
	layer, err := Layer(img.Files)
	if err != nil {
		return err
	}
	layerDesc := describe("application/vnd.oci.image.layer.v1.tar", layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": img.Entrypoint, "Env": img.Env, "WorkingDir": "/"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	configDesc := describe("application/vnd.oci.image.config.v1+json", config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := describe("application/vnd.oci.image.manifest.v1+json", manifest)
	manifestDesc.Annotations = map[string]string{
		"io.containerd.image.name":          img.Ref,
		"org.opencontainers.image.ref.name": img.Ref[colon+1:],
	}
	manifestDesc.Platform = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	blob := func(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }
	// Docker's own format, read by every `docker load`: it names the
	// same blobs.
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config": blob(configDesc), "RepoTags": []string{img.Ref}, "Layers": []string{blob(layerDesc)},
	}})
	if err != nil {
		return err
	}

	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{"blobs/", nil},
		{"blobs/sha256/", nil},
		{blob(layerDesc), layer},
		{blob(configDesc), config},
		{blob(manifestDesc), manifest},
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Typeflag: tar.TypeReg}
		if strings.HasSuffix(e.name, "/") {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
