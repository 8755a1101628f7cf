// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command ociarchive moves the image archives hack/build-image.sh writes
// (an OCI image layout in a tar: one image, or an image index of one
// image per platform) to where they are used, with go-containerregistry:
//
//	ociarchive push --archive FILE --ref REGISTRY/NAME:TAG [--plain-http]
//	ociarchive unpack --archive FILE --platform linux/arm64 --dir DIR
//
// push uploads the whole archive (every platform, one index) under ref
// with the credentials docker and helm use (~/.docker/config.json and
// its credential helpers: `docker login`, `crane auth login`); it prints
// the pushed digest. unpack writes one platform's file system into dir,
// as a container runtime would (the arm64 check runs it under qemu).
// hack/push.sh pushes the image and the chart together.
package main

import (
	"archive/tar"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	archive := fs.String("archive", "", "the image archive (hack/build-image.sh)")
	var err error
	switch os.Args[1] {
	case "push":
		ref := fs.String("ref", "", "where to push: REGISTRY/NAME:TAG")
		plain := fs.Bool("plain-http", false, "talk to the registry over HTTP (a registry on this machine or a test cluster's)")
		_ = fs.Parse(os.Args[2:])
		var digest string
		if digest, err = push(*archive, *ref, *plain); err == nil {
			fmt.Printf("%s@%s\n", *ref, digest)
		}
	case "unpack":
		platform := fs.String("platform", "", "the platform to unpack: linux/amd64 or linux/arm64")
		dir := fs.String("dir", "", "the directory to write the image's file system into")
		_ = fs.Parse(os.Args[2:])
		err = unpack(*archive, *platform, *dir)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ociarchive %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ociarchive push --archive FILE --ref REGISTRY/NAME:TAG [--plain-http]\n       ociarchive unpack --archive FILE --platform OS/ARCH --dir DIR")
	os.Exit(2)
}

// open extracts archive into a temporary OCI layout and returns what its
// index names: one image or one image index. done removes the layout.
func open(archive string) (img v1.Image, idx v1.ImageIndex, done func(), err error) {
	if archive == "" {
		return nil, nil, nil, errors.New("--archive is required")
	}
	dir, err := os.MkdirTemp("", "ociarchive-")
	if err != nil {
		return nil, nil, nil, err
	}
	remove := func() { os.RemoveAll(dir) }
	defer func() {
		if err != nil {
			remove()
		} else {
			done = remove
		}
	}()
	f, err := os.Open(archive)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	if err := untar(f, dir); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", archive, err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: not an OCI image layout: %w", archive, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, nil, nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, nil, nil, fmt.Errorf("%s: its index names %d entries, want one image or one image index", archive, len(m.Manifests))
	}
	d := m.Manifests[0]
	switch {
	case d.MediaType.IsIndex():
		idx, err = top.ImageIndex(d.Digest)
	case d.MediaType.IsImage():
		img, err = top.Image(d.Digest)
	default:
		err = fmt.Errorf("%s: its index names a %s, want an image or an image index", archive, d.MediaType)
	}
	return img, idx, nil, err
}

func push(archive, ref string, plainHTTP bool) (string, error) {
	var opts []name.Option
	if plainHTTP {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("--ref %q: %w", ref, err)
	}
	img, idx, done, err := open(archive)
	if err != nil {
		return "", err
	}
	defer done()
	auth := remote.WithAuthFromKeychain(authn.DefaultKeychain)
	if idx != nil {
		if err := remote.WriteIndex(tag, idx, auth); err != nil {
			return "", err
		}
		d, err := idx.Digest()
		return d.String(), err
	}
	if err := remote.Write(tag, img, auth); err != nil {
		return "", err
	}
	d, err := img.Digest()
	return d.String(), err
}

func unpack(archive, platform, dir string) error {
	want, err := v1.ParsePlatform(platform)
	if platform == "" || err != nil {
		return fmt.Errorf("--platform %q: want OS/ARCH (linux/arm64)", platform)
	}
	if dir == "" {
		return errors.New("--dir is required")
	}
	img, idx, done, err := open(archive)
	if err != nil {
		return err
	}
	defer done()
	if idx != nil {
		m, err := idx.IndexManifest()
		if err != nil {
			return err
		}
		img = nil
		var have []string
		for _, d := range m.Manifests {
			if d.Platform == nil {
				continue
			}
			have = append(have, d.Platform.String())
			if d.Platform.Satisfies(*want) {
				if img, err = idx.Image(d.Digest); err != nil {
					return err
				}
				break
			}
		}
		if img == nil {
			return fmt.Errorf("%s has no %s image (it has %s)", archive, platform, strings.Join(have, ", "))
		}
	} else if cfg, err := img.ConfigFile(); err != nil {
		return err
	} else if got := cfg.Platform(); got == nil || !got.Satisfies(*want) {
		return fmt.Errorf("%s is one image of %v, not %s", archive, got, platform)
	}
	fsys := mutate.Extract(img)
	defer fsys.Close()
	return untar(fsys, dir)
}

// untar writes a tar stream's regular files, directories and symbolic
// links under dir, refusing any name that would land outside it.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		rel := filepath.Clean(hdr.Name)
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("tar entry %q leaves the directory", hdr.Name)
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(hdr.Mode).Perm())
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode).Perm()); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			err = fmt.Errorf("tar entry %q: type %c not handled", hdr.Name, hdr.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}
