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

// RuntimeFiles are the files a dynamically linked program needs from the
// machine that built it: its program interpreter (the dynamic loader) and
// every shared library it names, transitively, plus the libraries named in
// dlopened, which the program loads at run time but links against none of
// (their own dependencies included). Each is taken at its path on this
// machine, with the symbolic links on the way (/lib -> usr/lib on a merged
// /usr), so the loader finds them in the image where it finds them here.
func RuntimeFiles(exe string, dlopened ...string) ([]File, error) {
	c := &collector{files: map[string]File{}}
	interp, needed, err := elfDeps(exe)
	if err != nil {
		return nil, err
	}
	if interp == "" {
		return nil, nil // static: nothing to add
	}
	if err := c.add(interp); err != nil {
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
		path, err := findLibrary(soname)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", exe, err)
		}
		if err := c.add(path); err != nil {
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

// libDirs are where the loader looks on Debian-like systems (multiarch
// first) and others.
func libDirs() []string {
	multiarch := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	var dirs []string
	if multiarch != "" {
		dirs = append(dirs, "/lib/"+multiarch, "/usr/lib/"+multiarch)
	}
	return append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
}

func findLibrary(soname string) (string, error) {
	for _, d := range libDirs() {
		p := filepath.Join(d, soname)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("shared library %s not found in %v", soname, libDirs())
}

// collector gathers files with the directories and symbolic links on
// their paths.
type collector struct{ files map[string]File }

func (c *collector) add(path string) error {
	return c.addDepth(filepath.Clean(path), 0)
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
