// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package drivertools_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// run runs a program in bin with an environment and stdin.
func run(bin, name, stdin string, env []string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The MPS control daemon stand-in starts in the background, answers its
// control interface, refuses bad values, records every command and quits.
func TestMPSControl(t *testing.T) {
	root := t.TempDir()
	if err := drivertools.Install(root, false); err != nil {
		t.Fatal(err)
	}
	pipe, logs := filepath.Join(t.TempDir(), "pipe"), filepath.Join(t.TempDir(), "log")
	env := []string{drivertools.PipeDirEnv + "=" + pipe, drivertools.LogDirEnv + "=" + logs, drivertools.VisibleEnv + "=GPU-a,GPU-b"}
	if out, err := run(root, drivertools.MPSControl, "get_server_list\n", env); err == nil {
		t.Fatalf("a client without a daemon succeeded: %s", out)
	}
	if out, err := run(root, drivertools.MPSControl, "", env, "-d"); err != nil {
		t.Fatalf("-d: %v: %s", err, out)
	}
	pidData, err := os.ReadFile(filepath.Join(pipe, drivertools.PIDFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = run(root, drivertools.MPSControl, "quit\n", env) })
	if out, err := run(root, drivertools.MPSControl, "", env, "-d"); err == nil {
		t.Errorf("a second daemon on the same pipe directory started: %s", out)
	}
	out, err := run(root, drivertools.MPSControl,
		"set_default_active_thread_percentage 40\nset_default_device_pinned_mem_limit 1 2048M\nget_default_active_thread_percentage\nget_default_device_pinned_mem_limit 1\n", env)
	if err != nil || out != "40.0\n40.0\n2048M\n" {
		t.Errorf("commands: %v: %q", err, out)
	}
	for _, bad := range []string{"set_default_active_thread_percentage 0", "set_default_active_thread_percentage 101",
		"set_default_device_pinned_mem_limit 2 1G", "set_default_device_pinned_mem_limit 0 lots", "start_the_engines"} {
		if out, err := run(root, drivertools.MPSControl, bad+"\n", env); err == nil {
			t.Errorf("%q accepted: %s", bad, out)
		}
	}
	if out, err := run(root, drivertools.MPSControl, "quit\n", env); err != nil {
		t.Fatalf("quit: %v: %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(pipe, drivertools.PIDFile)); !os.IsNotExist(err) {
		t.Errorf("PID file after quit: %v", err)
	}
	events, err := drivertools.MPSLog(logs)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, e := range events {
		if strings.TrimSpace(string(pidData)) != strconv.Itoa(e.PID) {
			t.Errorf("event of another process: %+v", e)
		}
		switch e.Event {
		case "start":
			if e.VisibleDevices != "GPU-a,GPU-b" {
				t.Errorf("start: %+v", e)
			}
		case "command":
			if !e.Failed {
				said = append(said, e.Command)
			}
		}
	}
	// get_server_list: the second -d asks whether one runs.
	want := []string{"get_server_list", "set_default_active_thread_percentage 40", "set_default_device_pinned_mem_limit 1 2048M",
		"get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 1", "quit"}
	if strings.Join(said, "|") != strings.Join(want, "|") {
		t.Errorf("recorded %q, want %q", said, want)
	}
	if last := events[len(events)-1]; last.Event != "exit" {
		t.Errorf("last event %+v, want the exit", last)
	}
}

// Each control daemon keeps its own defaults, as the real ones do (two
// daemons on one GPU each hold their clients to their own: the real H200
// in ../shared/realgpu): setting one's leaves the other's as they were.
func TestMPSControlDefaultsPerDaemon(t *testing.T) {
	root := t.TempDir()
	if err := drivertools.Install(root, false); err != nil {
		t.Fatal(err)
	}
	var envs [][]string
	for range 2 {
		env := []string{drivertools.PipeDirEnv + "=" + filepath.Join(t.TempDir(), "pipe"),
			drivertools.LogDirEnv + "=" + filepath.Join(t.TempDir(), "log"), drivertools.VisibleEnv + "=GPU-a"}
		if out, err := run(root, drivertools.MPSControl, "", env, "-d"); err != nil {
			t.Fatalf("-d: %v: %s", err, out)
		}
		t.Cleanup(func() { _, _ = run(root, drivertools.MPSControl, "quit\n", env) })
		envs = append(envs, env)
	}
	for i, set := range []string{"40 20480M", "30 10240M"} {
		threads, mem, _ := strings.Cut(set, " ")
		if out, err := run(root, drivertools.MPSControl,
			"set_default_active_thread_percentage "+threads+"\nset_default_device_pinned_mem_limit 0 "+mem+"\n", envs[i]); err != nil {
			t.Fatalf("daemon %d: %v: %s", i, err, out)
		}
	}
	for i, want := range []string{"40.0\n20480M\n", "30.0\n10240M\n"} {
		out, err := run(root, drivertools.MPSControl, "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n", envs[i])
		if err != nil || out != want {
			t.Errorf("daemon %d answers %q %v, want %q", i, out, err, want)
		}
	}
}

// The nvidia-smi stand-in sets the time slice of the mock GPU whose
// driver root it runs from, by UUID or PCI address, and refuses what the
// real one refuses.
func TestSMITimeSlice(t *testing.T) {
	h := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 2}]")
	const bus = "0000:43:00.0"
	dev, ret := h.NVML.DeviceGetHandleByPciBusId(bus)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	uuid, _ := dev.GetUUID()
	for _, id := range []string{uuid, bus} {
		for _, n := range []int{2, 0} {
			if out, err := run(h.DriverBin(), drivertools.SMI, "", nil, "compute-policy", "-i", id, "--set-timeslice", strconv.Itoa(n)); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got, _ := h.TimeSlice(bus); got != n {
				t.Errorf("time slice %d after setting %d through %s", got, n, id)
			}
		}
	}
	if got, _ := h.TimeSlice("0000:1b:00.0"); got != 0 {
		t.Errorf("the other GPU's time slice changed to %d", got)
	}
	for _, bad := range [][]string{
		{"compute-policy", "-i", uuid, "--set-timeslice", "4"},
		{"compute-policy", "-i", "GPU-nope", "--set-timeslice", "1"},
		{"-q"},
	} {
		if out, err := run(h.DriverBin(), drivertools.SMI, "", nil, bad...); err == nil {
			t.Errorf("%q accepted: %s", bad, out)
		}
	}
	// Each call that reached a GPU is counted, the one it refused (time
	// slice 4) too; an unknown GPU and another command reach none.
	want := map[string]map[string]int{bus: {persist.CallSetTimeSlice: 5}}
	if got := persist.SettingCalls(h.Calls()); !reflect.DeepEqual(got, want) {
		t.Errorf("setting calls %v, want %v", got, want)
	}
}

// TestInstallShared: a shared mock's stand-ins are links to a copy of the
// executable beside them, relative, so that they resolve wherever their
// folder is seen (a container runtime on the node mounting them), and
// they still run as the programs.
func TestInstallShared(t *testing.T) {
	bin := t.TempDir()
	if err := drivertools.Install(bin, true); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{drivertools.SMI, drivertools.MPSControl} {
		target, err := os.Readlink(filepath.Join(bin, name))
		if err != nil || filepath.IsAbs(target) {
			t.Fatalf("%s links to %q (%v), want a relative link", name, target, err)
		}
		if st, err := os.Stat(filepath.Join(bin, target)); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("%s's copy: %v %v", name, st, err)
		}
	}
	if out, err := run(bin, drivertools.SMI, "", nil, "--help"); err == nil || !strings.Contains(out, "the only command of the mock") {
		t.Errorf("the shared nvidia-smi stand-in does not run as nvidia-smi: %v: %s", err, out)
	}
	// Again (a reopened mock, a newer agent): replaced, nothing left over.
	if err := drivertools.Install(bin, true); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(bin); len(entries) != 3 {
		t.Errorf("after a second install: %v", entries)
	}
}
