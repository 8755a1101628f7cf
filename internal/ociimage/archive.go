// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package ociimage writes container images as tar archives without a
// registry or a container engine: an OCI image layout (what `ctr images
// import` reads) that also carries Docker's manifest.json (what `docker
// load` reads, before and after Docker 25), with one gzip layer per image:
// one image, or one per platform under an image index (the agent's
// amd64 and arm64 images). The agent's image (hack/build-image.sh) and the real-node suite's test
// images are written with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
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
	// Arch is the image's architecture as Go names it (amd64, arm64);
	// empty: this program's.
	Arch string
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

// WriteArchive writes one image, or one image per platform under one
// reference, to path. With several, the archive's index names an image
// index (as `ctr export` writes a multi-platform image): `ctr images
// import` takes the platforms it is asked for, a registry push
// (hack/push) the whole index; Docker's manifest.json names the image of
// the architecture this program runs on (docker load takes one).
func WriteArchive(path string, imgs ...Image) error {
	if len(imgs) == 0 {
		return fmt.Errorf("%s: no image to write", path)
	}
	ref := imgs[0].Ref
	colon := strings.LastIndex(ref, ":")
	if colon < 0 || strings.Contains(ref[colon:], "/") || !strings.Contains(ref[:colon], "/") {
		return fmt.Errorf("image reference %q: want <registry>/<name>:<tag>", ref)
	}
	blobs, manifests, dockerImage, err := imageManifests(ref, imgs)
	if err != nil {
		return err
	}
	index, dockerManifest, blobs, err := archiveIndexes(ref, ref[colon+1:], blobs, manifests, dockerImage)
	if err != nil {
		return err
	}
	entries := []archiveEntry{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{"blobs/", nil},
		{"blobs/sha256/", nil},
	}
	for _, b := range blobs {
		entries = append(entries, archiveEntry{b.path(), b.data})
	}
	return writeTar(path, entries)
}

// imageManifests makes each image's blobs (its layer, config and manifest,
// in that order) and manifest descriptor; dockerImage is the one Docker's
// format names: this machine's architecture, else the last.
func imageManifests(ref string, imgs []Image) (blobs []blob, manifests []descriptor, dockerImage int, err error) {
	dockerImage = -1
	seen := map[string]bool{}
	for i, img := range imgs {
		if img.Ref != ref {
			return nil, nil, 0, fmt.Errorf("one archive, one reference: %q and %q", ref, img.Ref)
		}
		arch := img.arch()
		if seen[arch] {
			return nil, nil, 0, fmt.Errorf("image %s: architecture %s given twice", ref, arch)
		}
		seen[arch] = true
		desc, b, err := img.manifest()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("image %s (%s): %w", ref, arch, err)
		}
		blobs = append(blobs, b...)
		manifests = append(manifests, desc)
		if arch == runtime.GOARCH || dockerImage < 0 && i == len(imgs)-1 {
			dockerImage = i
		}
	}
	return blobs, manifests, dockerImage, nil
}

// archiveIndexes makes the archive's index.json (one image, or an image
// index of several, added to blobs, named ref) and Docker's manifest.json.
func archiveIndexes(ref, tag string, blobs []blob, manifests []descriptor, dockerImage int) (index, dockerManifest []byte, _ []blob, err error) {
	top := manifests[0]
	if len(manifests) > 1 {
		list, err := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     mediaIndex,
			"manifests":     manifests,
		})
		if err != nil {
			return nil, nil, nil, err
		}
		top = describe(mediaIndex, list)
		blobs = append(blobs, blob{top, list})
	}
	top.Annotations = map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	}
	if index, err = json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{top},
	}); err != nil {
		return nil, nil, nil, err
	}
	// Docker's own format, read by every `docker load`: it names the
	// same blobs. blobs holds each image's layer, config and manifest
	// in that order.
	dockerManifest, err = json.Marshal([]map[string]any{{
		"Config": blobs[3*dockerImage+1].path(), "RepoTags": []string{ref}, "Layers": []string{blobs[3*dockerImage].path()},
	}})
	return index, dockerManifest, blobs, err
}

// archiveEntry is a file ("name") or a folder ("name/") of the archive.
type archiveEntry struct {
	name string
	data []byte
}

// writeTar writes entries as a tar file at path, whole or not at all
// (written beside it, then renamed).
func writeTar(path string, entries []archiveEntry) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
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

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type blob struct {
	desc descriptor
	data []byte
}

func (b blob) path() string { return "blobs/sha256/" + strings.TrimPrefix(b.desc.Digest, "sha256:") }

func (img Image) arch() string {
	if img.Arch != "" {
		return img.Arch
	}
	return runtime.GOARCH
}

// manifest builds img's layer (gzip: what registries serve and nodes
// pull), config and manifest: the blobs in that order, and the manifest's
// descriptor with its platform.
func (img Image) manifest() (descriptor, []blob, error) {
	layer, err := Layer(img.Files)
	if err != nil {
		return descriptor{}, nil, err
	}
	diffID := describe("", layer).Digest
	var zipped bytes.Buffer
	// No name, no time in the gzip header: the same files, the same digest.
	zw := gzip.NewWriter(&zipped)
	if _, err := zw.Write(layer); err != nil {
		return descriptor{}, nil, err
	}
	if err := zw.Close(); err != nil {
		return descriptor{}, nil, err
	}
	layerDesc := describe(mediaLayer, zipped.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": img.arch(),
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": img.Entrypoint, "Env": img.Env, "WorkingDir": "/"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return descriptor{}, nil, err
	}
	configDesc := describe(mediaConfig, config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layerDesc},
	})
	if err != nil {
		return descriptor{}, nil, err
	}
	desc := describe(mediaManifest, manifest)
	desc.Platform = map[string]string{"architecture": img.arch(), "os": "linux"}
	return desc, []blob{{layerDesc, zipped.Bytes()}, {configDesc, config}, {desc, manifest}}, nil
}
