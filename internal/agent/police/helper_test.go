// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the tenants' processes: with helperEnv set
// it runs one of the helpers below instead of the tests.
const helperEnv = "HWDRA_POLICE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "rewrite":
		rewriteHelper()
	case "bigenv":
		bigEnvHelper()
	default:
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", os.Getenv(helperEnv))
		os.Exit(2)
	}
	os.Exit(0)
}

// helper starts the test binary as a helper process; its stdin and
// stdout are the test's to talk to it (it answers "ready" first).
type helper struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Reader
}

func startHelper(t testing.TB, name string, env []string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append([]string{helperEnv + "=" + name}, env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	h := &helper{cmd: cmd, in: in.(*os.File), out: bufio.NewReader(out)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	h.expect(t, "ready")
	return h
}

// say sends a line and waits for the answer "ok".
func (h *helper) say(t testing.TB, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.in, line); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "ok")
}

func (h *helper) expect(t testing.TB, want string) {
	t.Helper()
	line, err := h.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("helper said %q (%v), want %q", line, err, want)
	}
}

// rewriteHelper rewrites its own environment in place, as a tenant's
// process can: each line on stdin is "<from>\t<to>" (Go-quoted), the first
// <from> in the environment block is overwritten by <to> (padded with
// NULs to its length) through /proc/self/mem. It answers "ok".
func rewriteHelper() {
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		from, to, _ := strings.Cut(in.Text(), "\t")
		if err := rewriteEnv(unquote(from), unquote(to)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ok")
	}
}

func unquote(s string) string {
	u, err := strconv.Unquote(s)
	if err != nil {
		return s
	}
	return u
}

func rewriteEnv(from, to string) error {
	start, end, err := envArea()
	if err != nil {
		return err
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	area := make([]byte, end-start)
	if _, err := mem.ReadAt(area, int64(start)); err != nil {
		return err
	}
	i := bytes.Index(area, []byte(from))
	if i < 0 || len(to) > len(from) {
		return fmt.Errorf("cannot rewrite %q to %q", from, to)
	}
	b := append([]byte(to), make([]byte, len(from)-len(to))...)
	_, err = mem.WriteAt(b, int64(start)+int64(i))
	return err
}

// envArea is where the process's environment block is: fields 50 and
// 51 of /proc/self/stat (env_start, env_end).
func envArea() (uint64, uint64, error) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	// Field 3 is f[0]: env_start (50) is f[47], env_end (51) f[48].
	start, err1 := strconv.ParseUint(f[47], 10, 64)
	end, err2 := strconv.ParseUint(f[48], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("stat: env_start %q env_end %q", f[47], f[48])
	}
	return start, end, nil
}

// bigEnvHelper makes itself an environment larger than exec(2) allows,
// as any process can where the kernel has CONFIG_CHECKPOINT_RESTORE
// (prctl PR_SET_MM_MAP needs no capability): a mapping of BIGENV_BYTES
// of padding entries, then BIGENV_TAIL's entries (separated by ";"), made
// its environment block. It answers "ready" and waits to be killed.
func bigEnvHelper() {
	size, _ := strconv.Atoi(os.Getenv("BIGENV_BYTES"))
	var tail []byte
	for e := range strings.SplitSeq(os.Getenv("BIGENV_TAIL"), ";") {
		tail = append(append(tail, e...), 0)
	}
	mem, err := unix.Mmap(-1, 0, size+len(tail), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fail("mmap", err)
	}
	for i := 0; i < size; {
		entry := fmt.Sprintf("PAD%d=%s", i, strings.Repeat("y", min(100000, size-i)))
		n := copy(mem[i:size-1], entry)
		i += n + 1 // NUL after it (the mapping is zeroed)
	}
	copy(mem[size:], tail)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	if err := setEnvArea(start, start+uint64(len(mem))); err != nil {
		fail("prctl(PR_SET_MM_MAP)", err)
	}
	fmt.Println("ready")
	for {
		time.Sleep(time.Hour) // the helper process idles until the test kills it
	}
}

func fail(what string, err error) {
	fmt.Fprintln(os.Stderr, what+":", err)
	os.Exit(1)
}

// mmMap is the kernel's struct prctl_mm_map.
type mmMap struct {
	startCode, endCode, startData, endData, startBrk, brk, startStack uint64
	argStart, argEnd, envStart, envEnd                                uint64
	auxv                                                              uintptr
	auxvSize, exeFD                                                   uint32
}

// setEnvArea points the process's environment block at [start, end),
// its other bounds as they are (/proc/self/stat; brk from brk(0)).
func setEnvArea(start, end uint64) error {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return err
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	field := func(n int) uint64 { v, _ := strconv.ParseUint(f[n-3], 10, 64); return v }
	brk, _, _ := unix.Syscall(unix.SYS_BRK, 0, 0, 0)
	m := mmMap{
		startCode: field(26), endCode: field(27), startStack: field(28),
		startData: field(45), endData: field(46), startBrk: field(47), brk: uint64(brk),
		argStart: field(48), argEnd: field(49), envStart: start, envEnd: end,
		exeFD: ^uint32(0),
	}
	return unix.Prctl(unix.PR_SET_MM, unix.PR_SET_MM_MAP, uintptr(unsafe.Pointer(&m)), unsafe.Sizeof(m), 0)
}
