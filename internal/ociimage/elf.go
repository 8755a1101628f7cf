// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package ociimage

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// RuntimeFiles are the files a dynamically linked program needs at run
// time: its program interpreter (the dynamic loader) and every shared
// library it names, transitively, plus the libraries named in dlopened,
// which the program loads at run time but links against none of (their
// own dependencies included).
//
// A program of this machine's architecture gets them from this machine,
// each at its path here, with the symbolic links on the way (/lib ->
// usr/lib on a merged /usr), so the loader finds them in the image where
// it finds them here. A cross-compiled one (arm64 built on amd64) gets
// them from the cross toolchain's libraries (Debian's libc6-<arch>-cross
// under /usr/<triple>/lib, or a multiarch libc), placed where that
// architecture's loader looks on a Debian-like system: the loader at its
// interpreter path, the libraries in /usr/lib/<triple>.
func RuntimeFiles(exe string, dlopened ...string) ([]File, error) {
	arch, err := Arch(exe)
	if err != nil {
		return nil, err
	}
	c := &collector{files: map[string]File{}, arch: arch}
	interp, needed, err := elfDeps(exe)
	if err != nil {
		return nil, err
	}
	if interp == "" {
		return nil, nil // static: nothing to add
	}
	if err := c.addInterp(interp); err != nil {
		return nil, fmt.Errorf("program interpreter of %s: %w", exe, err)
	}
	queue := append(needed, dlopened...)
	done := map[string]bool{}
	for len(queue) > 0 {
		soname := queue[0]
		queue = queue[1:]
		if done[soname] || strings.HasPrefix(soname, "linux-vdso") {
			continue
		}
		done[soname] = true
		path, err := findLibrary(arch, soname)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", exe, err)
		}
		if err := c.addLibrary(path); err != nil {
			return nil, err
		}
		_, more, err := elfDeps(path)
		if err != nil {
			return nil, err
		}
		queue = append(queue, more...)
	}
	out := make([]File, 0, len(c.files))
	for _, f := range c.files {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// triples are the GNU triples of the architectures images are built for:
// Debian's multiarch directory and cross toolchain prefix.
var triples = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Arch is the architecture (as Go names it) of the ELF program at path.
func Arch(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("%s: ELF machine %v: not an architecture images are built for (amd64, arm64)", path, f.Machine)
}

func elfDeps(path string) (interp string, needed []string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			buf := make([]byte, p.Filesz)
			if _, err := p.ReadAt(buf, 0); err != nil {
				return "", nil, fmt.Errorf("%s: PT_INTERP: %w", path, err)
			}
			interp = strings.TrimRight(string(buf), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return interp, needed, nil
}

// libDirs are where arch's libraries are on this machine: for its own
// architecture where the loader looks on Debian-like systems (multiarch
// first) and others; for another, the cross toolchain's and multiarch
// directories.
func libDirs(arch string) []string {
	triple := triples[arch]
	if arch != runtime.GOARCH {
		return []string{"/usr/" + triple + "/lib", "/usr/lib/" + triple, "/lib/" + triple}
	}
	var dirs []string
	if triple != "" {
		dirs = append(dirs, "/lib/"+triple, "/usr/lib/"+triple)
	}
	return append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
}

func findLibrary(arch, soname string) (string, error) {
	for _, d := range libDirs(arch) {
		p := filepath.Join(d, soname)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	hint := ""
	if arch != runtime.GOARCH {
		hint = fmt.Sprintf(" (Debian: apt-get install libc6-dev-%s-cross)", arch)
	}
	return "", fmt.Errorf("%s library %s not found in %v%s", arch, soname, libDirs(arch), hint)
}

// collector gathers files with the directories and symbolic links on
// their paths.
type collector struct {
	files map[string]File
	arch  string
}

func (c *collector) cross() bool { return c.arch != runtime.GOARCH }

// addInterp adds the program interpreter at the path the program names.
func (c *collector) addInterp(interp string) error {
	if !c.cross() {
		return c.addDepth(filepath.Clean(interp), 0)
	}
	host, err := findLibrary(c.arch, filepath.Base(interp))
	if err != nil {
		return err
	}
	return c.put(interp, host)
}

// addLibrary adds a library found at path on this machine.
func (c *collector) addLibrary(path string) error {
	if !c.cross() {
		return c.addDepth(filepath.Clean(path), 0)
	}
	return c.put(filepath.Join("/usr/lib", triples[c.arch], filepath.Base(path)), path)
}

// put adds the file at host (links followed) as a regular file at path in
// the image, with its parent directories.
func (c *collector) put(path, host string) error {
	data, err := os.ReadFile(host)
	if err != nil {
		return err
	}
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	for dir := filepath.Dir(rel); dir != "."; dir = filepath.Dir(dir) {
		if _, ok := c.files[dir]; !ok {
			c.files[dir] = File{Path: dir, Mode: 0o755, Dir: true}
		}
	}
	c.files[rel] = File{Path: rel, Mode: 0o755, Data: data}
	return nil
}

func (c *collector) addDepth(path string, depth int) error {
	if depth > 16 {
		return fmt.Errorf("%s: too many symbolic links", path)
	}
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := filepath.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(next, "/")
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			c.files[rel] = File{Path: rel, Link: target}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return c.addDepth(filepath.Join(append([]string{target}, parts[i+1:]...)...), depth+1)
		case i == len(parts)-1:
			data, err := os.ReadFile(next)
			if err != nil {
				return err
			}
			c.files[rel] = File{Path: rel, Mode: int64(fi.Mode().Perm()), Data: data}
		default:
			c.files[rel] = File{Path: rel, Mode: 0o755, Dir: true}
		}
		cur = next
	}
	return nil
}
