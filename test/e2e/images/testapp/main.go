// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command testapp is the workload image of the real-node tests. It prints
// what a container sees of its devices — its environment and the files,
// directories and device nodes named in its arguments — so that a test can
// read the result with `kubectl logs`, then sleeps until SIGTERM.
//
// Output format (one section per line-delimited block, parsed by tests):
//
//	=== ENV
//	KEY=value
//	=== FILE /path
//	<contents>
//	=== DEV /dev/x char 195:0
//	=== DIR /path
//	=== OTHER /path <type>   (FIFO, socket: not read)
//	=== MISSING /path: <error>
//	=== NET <name> mtu=<mtu> mac=<mac> up=<true|false> addrs=<cidr>,<cidr>
//	=== END
//
// NET lines list the container's network interfaces (its pod's network
// namespace), after the paths.
//
// With TESTAPP_EXEC_ENV ("K=V;K=V") it first executes itself again, in
// the same process, with those variables set over what the container got:
// a workload that starts with an environment of its own choosing (its
// /proc/<pid>/environ says so), such as MPS limits above its share.
//
// With TESTAPP_TENANT it first acts as a hostile tenant (tenant.go).
package main

import (
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

func main() {
	if os.Getenv(exitNowEnv) != "" {
		return
	}
	if set := os.Getenv(execEnv); set != "" {
		reexec(set)
	}
	w := os.Stdout
	if spec := os.Getenv(tenantEnv); spec != "" {
		tenant(w, spec)
	}
	fmt.Fprintln(w, "=== ENV")
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Fprintln(w, kv)
	}
	for _, arg := range os.Args[1:] {
		show(w, arg)
	}
	showInterfaces(w)
	fmt.Fprintln(w, "=== END")

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
}

const execEnv = "TESTAPP_EXEC_ENV"

// reexec executes the program again with the variables in set ("K=V;K=V")
// over its environment, without TESTAPP_EXEC_ENV.
func reexec(set string) {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	delete(env, execEnv)
	for _, kv := range strings.Split(set, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	exe, err := os.Executable()
	if err == nil {
		err = syscall.Exec(exe, os.Args, out)
	}
	fmt.Fprintf(os.Stderr, "testapp: executing again with %s: %v\n", set, err)
	os.Exit(1)
}

// show prints one path: a directory recursively, a device node with its
// numbers, a regular file with its contents.
func show(w *os.File, root string) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(w, "=== MISSING %s: %v\n", path, err)
			return nil
		}
		info, err := os.Stat(path) // follow symlinks: CDI and metadata files may be links
		if err != nil {
			fmt.Fprintf(w, "=== MISSING %s: %v\n", path, err)
			return nil
		}
		switch {
		case info.IsDir():
			fmt.Fprintf(w, "=== DIR %s\n", path)
		case info.Mode()&os.ModeDevice != 0:
			kind := "block"
			if info.Mode()&os.ModeCharDevice != 0 {
				kind = "char"
			}
			st := info.Sys().(*syscall.Stat_t)
			fmt.Fprintf(w, "=== DEV %s %s %d:%d\n", path, kind, major(st.Rdev), minor(st.Rdev))
		case !info.Mode().IsRegular():
			// FIFOs, sockets, /dev/stdout and friends: reading them would
			// block or read our own output.
			fmt.Fprintf(w, "=== OTHER %s %s\n", path, info.Mode().Type())
		default:
			data, err := readHead(path, maxFileBytes)
			if err != nil {
				fmt.Fprintf(w, "=== MISSING %s: %v\n", path, err)
				return nil
			}
			fmt.Fprintf(w, "=== FILE %s\n", path)
			w.Write(data)
			if len(data) > 0 && data[len(data)-1] != '\n' {
				fmt.Fprintln(w)
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(w, "=== MISSING %s: %v\n", root, err)
	}
}

// showInterfaces prints every network interface of the container.
func showInterfaces(w *os.File) {
	ifaces, err := net.Interfaces()
	if err != nil {
		fmt.Fprintf(w, "=== MISSING interfaces: %v\n", err)
		return
	}
	for _, i := range ifaces {
		var cidrs []string
		if addrs, err := i.Addrs(); err == nil {
			for _, a := range addrs {
				cidrs = append(cidrs, a.String())
			}
		}
		fmt.Fprintf(w, "=== NET %s mtu=%d mac=%s up=%t addrs=%s\n", i.Name, i.MTU, i.HardwareAddr, i.Flags&net.FlagUp != 0, strings.Join(cidrs, ","))
	}
}

// maxFileBytes bounds what one file adds to the log (metadata and config
// files are small; anything larger is not what a test looks for).
const maxFileBytes = 64 << 10

func readHead(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}

// major and minor decode Linux's dev_t like glibc's gnu_dev_major/minor.
func major(dev uint64) uint64 { return ((dev >> 8) & 0xfff) | ((dev >> 32) &^ 0xfff) }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) &^ 0xff) }
