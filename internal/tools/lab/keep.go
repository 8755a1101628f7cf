// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/state"
)

// keptFile, in the state directory of a run that left claims prepared,
// says how to undo them: Undo reads it.
const keptFile = "lab-kept.json"

// keptRun is a run that left claims prepared, as keptFile records it.
type keptRun struct {
	Hardware   string `json:"hardware"`
	ConfigPath string `json:"configPath,omitempty"`
	// MockDir is where mock hardware outlives the run (persist.DirEnv);
	// empty: mock hardware went with the run.
	MockDir          string `json:"mockDir,omitempty"`
	StateDir, CDIDir string
	// TempDir is the run's temporary directory, removed by the undo.
	TempDir string `json:"tempDir,omitempty"`
}

// recordKept writes keptFile and prints the command that undoes the
// claims left, with the MPS daemons' PIDs.
func (r *run) recordKept() error {
	k := keptRun{Hardware: r.opts.Hardware, ConfigPath: r.opts.ConfigPath, StateDir: r.opts.StateDir, CDIDir: r.opts.CDIDir, TempDir: r.tmp}
	if strings.HasPrefix(k.Hardware, backend.MockPrefix) {
		if dir := os.Getenv(persist.DirEnv); dir != "" {
			k.MockDir, _ = filepath.Abs(dir)
		}
	}
	for _, p := range []*string{&k.ConfigPath, &k.StateDir, &k.CDIDir} {
		if *p != "" {
			*p, _ = filepath.Abs(*p)
		}
	}
	data, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(k.StateDir, keptFile), data, 0o600); err != nil {
		return fmt.Errorf("recording how to undo what is left: %w", err)
	}
	if k.MockDir == "" && strings.HasPrefix(k.Hardware, backend.MockPrefix) {
		fmt.Fprintln(r.out, "note: the mock hardware ends with this run; its MPS daemons go on until undone")
	}
	fmt.Fprintf(r.out, "Undo it with: hwdra lab undo %s\n", k.StateDir)
	return nil
}

// Undo undoes what a lab run left prepared (Options.Keep, or an undo
// that could not finish), from the record in dir (the state directory
// the run named). Where the run's hardware is still there (the host, or
// mock hardware that outlives processes) each claim is unprepared as the
// run would have, the hardware restored; where it went with the run (mock
// hardware), the MPS daemons the run started are ended (only a process
// confirmed to be the daemon: its PID and start time, through a pidfd)
// and the records removed. Either way the run's temporary directory goes.
func Undo(ctx context.Context, out io.Writer, dir string) error {
	ctx = withLogger(ctx, out)
	data, err := os.ReadFile(filepath.Join(dir, keptFile))
	if err != nil {
		return fmt.Errorf("%s: not what a lab run left (%w)", dir, err)
	}
	var k keptRun
	if err := json.Unmarshal(data, &k); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, keptFile), err)
	}
	if strings.HasPrefix(k.Hardware, backend.MockPrefix) && !exists(k.MockDir) {
		err = undoGone(ctx, out, k)
	} else {
		err = undoOn(ctx, out, k)
	}
	if err != nil {
		return err
	}
	if k.TempDir != "" {
		err = os.RemoveAll(k.TempDir)
	} else {
		err = os.Remove(filepath.Join(k.StateDir, keptFile))
	}
	if err == nil {
		fmt.Fprintln(out, "undone")
	}
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return path != "" && err == nil
}

// undoOn unprepares the claims left on hardware that is still there.
func undoOn(ctx context.Context, out io.Writer, k keptRun) (err error) {
	if k.MockDir != "" {
		if err := os.Setenv(persist.DirEnv, k.MockDir); err != nil {
			return err
		}
	}
	cfg, err := config.Load(k.ConfigPath)
	if err != nil {
		return err
	}
	node, err := backend.OpenWith(k.Hardware, backend.Options{Logger: klog.FromContext(ctx)})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, node.Close()) }()
	inv, err := node.Inventory(ctx)
	if err != nil {
		fmt.Fprintf(out, "warning: some devices could not be read: %v\n", err)
	}
	drivers, err := agent.NewDrivers(ctx, node, inv, agent.PluginOptions{StateDir: k.StateDir, CDIDir: k.CDIDir, Published: published(inv), Config: cfg, NodeName: NodeName})
	if err != nil {
		return err
	}
	var handed []handedClaim
	if g := drivers.GPU; g != nil {
		handed = append(handed, leftClaims(g.Name, g.Plugin, g.Plugin.Claims())...)
	}
	if n := drivers.NIC; n != nil {
		handed = append(handed, leftClaims(n.Name, n.Plugin, n.Plugin.Claims())...)
	}
	printDaemons(out, drivers.GPU)
	_, err = undo(ctx, out, nil, handed, undoEnv{opts: Options{StateDir: k.StateDir, CDIDir: k.CDIDir}, node: node, before: inv, gpu: drivers.GPU})
	return err
}

// leftClaims are a driver's prepared claims, to be undone.
func leftClaims[R any](driver string, p kubeletplugin.DRAPlugin, claims map[types.UID]prepare.Claim[R]) []handedClaim {
	var out []handedClaim
	for uid, c := range claims {
		out = append(out, handedClaim{driver: driver, plugin: p, claim: &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: uid}}})
	}
	return out
}

// undoGone ends the MPS daemons of a run whose mock hardware is gone and
// removes its records: nothing else of it is left.
func undoGone(ctx context.Context, out io.Writer, k keptRun) error {
	section(out, "Undo: the run's mock hardware is gone; ending its MPS daemons")
	m, err := mps.Open(mps.Options{Dir: filepath.Join(k.StateDir, "mps"), StateFile: filepath.Join(k.StateDir, device.GPUDriver+".mps.json")})
	if err != nil {
		return err
	}
	var errs []error
	if len(m.IDs()) == 0 {
		fmt.Fprintln(out, "no MPS control daemons")
	}
	for _, id := range m.IDs() {
		pid := m.PID(id)
		if err := m.Stop(ctx, id); err != nil {
			errs = append(errs, err)
			fmt.Fprintf(out, "MPS control daemon %s (PID %d): %v\n", id, pid, err)
			continue
		}
		fmt.Fprintf(out, "MPS control daemon %s (PID %d): ended\n", id, pid)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	errs = append(errs, removeSpecs(k))
	if k.TempDir == "" {
		// The records are of hardware that is gone.
		errs = append(errs, os.RemoveAll(k.StateDir))
	}
	return errors.Join(errs...)
}

// removeSpecs removes the CDI specs of the claims the checkpoints hold
// (the CDI directory may be shared: only the run's own go).
func removeSpecs(k keptRun) error {
	var errs []error
	for _, driver := range []string{device.GPUDriver, device.NICDriver} {
		data, err := state.Read(filepath.Join(k.StateDir, driver+".checkpoint.json"), state.CheckpointFormat)
		if err != nil || data == nil {
			errs = append(errs, err)
			continue
		}
		var cp struct {
			Claims map[types.UID]json.RawMessage `json:"claims"`
		}
		if err := json.Unmarshal(data, &cp); err != nil {
			errs = append(errs, err)
			continue
		}
		for uid := range cp.Claims {
			path := filepath.Join(k.CDIDir, driver+"_claim_"+string(uid)+".json")
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
