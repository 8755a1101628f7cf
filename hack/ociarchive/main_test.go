// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/hwdra/hwdra/internal/ociimage"
)

func archive(t *testing.T, ref string, archs ...string) string {
	t.Helper()
	var imgs []ociimage.Image
	for _, arch := range archs {
		imgs = append(imgs, ociimage.Image{Ref: ref, Arch: arch, Entrypoint: []string{"/app"},
			Files: []ociimage.File{
				{Path: "app", Mode: 0o755, Data: []byte("app for " + arch)},
				{Path: "usr", Mode: 0o755, Dir: true},
				{Path: "usr/lib", Mode: 0o755, Dir: true},
				{Path: "lib", Link: "usr/lib"},
			}})
	}
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := ociimage.WriteArchive(path, imgs...); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPush: a two-platform archive is pushed as one index whose platforms
// a node pulls (the registry is go-containerregistry's, over HTTP as with
// --plain-http); a one-platform archive as one image; the pushed digest
// is the archive's.
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	ref := host + "/hwdra/agent:1.0.0"
	digest, err := push(archive(t, "registry.local/agent:1.0.0", "amd64", "arm64"), ref, true)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(parse(t, ref))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d.String() != digest {
		t.Errorf("registry has %s, push said %s", d, digest)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.String())
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if layers, err := img.Layers(); err != nil || len(layers) != 1 {
			t.Errorf("%s: %d layers, %v", d.Platform, len(layers), err)
		}
	}
	if strings.Join(platforms, ",") != "linux/amd64,linux/arm64" {
		t.Errorf("pushed platforms %v", platforms)
	}

	one := host + "/hwdra/agent:single"
	if _, err := push(archive(t, "registry.local/agent:1.0.0", "amd64"), one, true); err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(parse(t, one))
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := img.ConfigFile(); err != nil || cfg.Architecture != "amd64" {
		t.Errorf("single image: %+v, %v", cfg, err)
	}

	for _, bad := range []struct{ archive, ref, want string }{
		{"", ref, "--archive is required"},
		{filepath.Join(t.TempDir(), "missing.tar"), ref, "no such file"},
		{archive(t, "registry.local/agent:1", "amd64"), "Not A Ref", "--ref"},
	} {
		if _, err := push(bad.archive, bad.ref, true); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("push(%q, %q): %v, want an error saying %q", bad.archive, bad.ref, err, bad.want)
		}
	}
}

func parse(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestUnpack: one platform's files, directories and links come out of an
// index; a platform the archive lacks is named with those it has.
func TestUnpack(t *testing.T) {
	path := archive(t, "registry.local/agent:1.0.0", "amd64", "arm64")
	dir := t.TempDir()
	if err := unpack(path, "linux/arm64", dir); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "app")); err != nil || string(data) != "app for arm64" {
		t.Errorf("app: %q, %v", data, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "lib")); err != nil || target != "usr/lib" {
		t.Errorf("lib: %q, %v", target, err)
	}
	err := unpack(path, "linux/s390x", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "linux/amd64, linux/arm64") {
		t.Errorf("unpack of a missing platform: %v", err)
	}
	if err := unpack(archive(t, "registry.local/agent:1.0.0", "amd64"), "linux/arm64", t.TempDir()); err == nil {
		t.Error("unpack of an amd64-only archive as arm64: no error")
	}
}
