// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// A real runtime creates the device nodes of a MIG device's CDI spec in a
// container: runc, with the host's /bin, /lib and /usr bound into an empty
// root file system.
func TestRuncCreatesDeviceNodes(t *testing.T) {
	if !nodefs.CanMknod() {
		t.Skip("not root: runc cannot create device nodes")
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("no runc in PATH")
	}
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", false)
	c := e.claim(request{name: "mig", cel: `profile == "2g.20gb"`})
	devs := e.mustPrepare(c)
	defer e.unprepare(c)

	bundle := t.TempDir()
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Skipf("runc spec: %v: %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"/bin/sh", "-c",
		`for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && stat -c "%n %t %T" "$f"; done; env`}
	spec.Root = &oci.Root{Path: "rootfs", Readonly: true}
	for _, d := range []string{"bin", "lib", "lib64", "usr", "proc", "dev", "sys"} {
		os.MkdirAll(filepath.Join(bundle, "rootfs", d), 0o755)
	}
	for _, d := range []string{"/bin", "/lib", "/lib64", "/usr"} {
		spec.Mounts = append(spec.Mounts, oci.Mount{Destination: d, Type: "bind", Source: d, Options: []string{"rbind", "ro"}})
	}
	injected := e.inject(devs) // the CDI edits, applied to runc's spec below
	spec.Linux.Devices = injected.Linux.Devices
	spec.Linux.Resources.Devices = append(spec.Linux.Resources.Devices, injected.Linux.Resources.Devices...)
	spec.Process.Env = append(spec.Process.Env, injected.Process.Env...)
	raw, _ = json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}

	id := fmt.Sprintf("hwdra-gpu-test-%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	run := exec.CommandContext(ctx, runc, "run", "--bundle", bundle, id)
	run.Stdout, run.Stderr = &stdout, &stderr
	err = run.Run()
	exec.Command(runc, "delete", "-f", id).Run()
	if err != nil {
		t.Fatalf("runc run: %v\n%s%s", err, stdout.String(), stderr.String())
	}

	got := map[string]string{}
	env := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if f := strings.Fields(line); len(f) == 3 && strings.HasPrefix(f[0], "/dev/") {
			major, _ := strconv.ParseInt(f[1], 16, 64)
			minor, _ := strconv.ParseInt(f[2], 16, 64)
			got[f[0]] = fmt.Sprintf("%d:%d", major, minor)
		} else if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	for _, d := range injected.Linux.Devices {
		if want := fmt.Sprintf("%d:%d", d.Major, d.Minor); got[d.Path] != want {
			t.Errorf("in the container %s is %q, want character device %s", d.Path, got[d.Path], want)
		}
	}
	if len(got) != len(injected.Linux.Devices) {
		t.Errorf("container has %v, injected %d nodes", got, len(injected.Linux.Devices))
	}
	if env["NVIDIA_VISIBLE_DEVICES"] != "void" || !strings.HasPrefix(env[envName(devs[0].DeviceName, "UUID")], "MIG-") {
		t.Errorf("container environment %v", env)
	}
}
