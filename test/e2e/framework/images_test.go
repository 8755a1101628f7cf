package framework

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOCIArchive: the archive is a valid OCI layout whose blobs match their
// digests and whose index names the image, as `ctr images import` needs.
func TestOCIArchive(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "prog")
	if err := os.WriteFile(exe, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "img.tar")
	if err := writeOCIArchive(archive, TestAppImage, exe); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[hdr.Name] = data
	}
	if _, ok := files["oci-layout"]; !ok {
		t.Fatal("no oci-layout")
	}
	for name, data := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != d {
				t.Errorf("blob %s has digest %x", name, sum)
			}
		}
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("%d manifests", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != TestAppImage || m.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("annotations %v", m.Annotations)
	}
	if _, ok := files["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")]; !ok {
		t.Error("manifest blob missing")
	}
}
