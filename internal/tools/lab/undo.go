// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
)

// handedClaim is a claim the lab handed to a driver's prepare: what the
// undo takes back, whether or not its prepare succeeded.
type handedClaim struct {
	driver string
	plugin kubeletplugin.DRAPlugin
	claim  *resourceapi.ResourceClaim
	// failed: its prepare returned an error (the plugin rolls a failed
	// claim back itself, but on the context that may have been cancelled,
	// which can leave it recorded half-prepared: unprepare finishes it).
	failed bool
	// cdi are the CDI devices its prepare gave (the containers' names for
	// its devices), for Options.Exec.
	cdi []string
}

// undoEnv is what the undo reports against.
type undoEnv struct {
	opts   Options
	node   *backend.Node
	before hw.Inventory
	gpu    *agent.GPU
}

// undoTimeout bounds the unprepare of one claim, and the look at the
// hardware after them: long enough for MPS daemons that must be killed
// (a quit, then SIGTERM, then SIGKILL, 2 s apart) and for MIG instances on
// a busy GPU; a claim that takes longer is left, named, and the others
// are undone.
const undoTimeout = time.Minute

// undo unprepares every handed claim, last first (an MPS daemon goes
// after the claims it serves), each on a context of its own: ctx's values
// (the logger) without its cancellation, bounded by undoTimeout; no
// signal cuts it short (a repeated one is answered, NoteRepeatedSignals).
// cause is why the run ends (nil: it succeeded). It prints what it undid,
// the hardware and MPS daemons that still differ from the start, every
// GPU and VF setting it could not restore (with what it was), and the claims it
// left and where their records are; left reports that claims are left,
// err that anything is.
func undo(ctx context.Context, out io.Writer, cause error, handed []handedClaim, env undoEnv) (left bool, err error) {
	switch {
	case cause == nil:
		section(out, "Unprepare")
	case ctx.Err() != nil:
		section(out, fmt.Sprintf("Undo: interrupted (%v)", context.Cause(ctx)))
	default:
		section(out, "Undo: the run failed (the error is at the end)")
	}
	if cause != nil && env.opts.Keep {
		fmt.Fprintln(out, "note: --keep keeps the claims of a run in which every claim prepared, not what a failed one left")
	}
	var (
		kept []string
		errs []error
	)
	for i := len(handed) - 1; i >= 0; i-- {
		h := handed[i]
		uctx, cancel := undoContext(ctx)
		results, err := h.plugin.UnprepareResourceClaims(uctx, []kubeletplugin.NamespacedObject{
			{NamespacedName: types.NamespacedName{Namespace: h.claim.Namespace, Name: h.claim.Name}, UID: h.claim.UID}})
		cancel()
		if err == nil {
			err = results[h.claim.UID]
		}
		switch {
		case err != nil:
			kept = append(kept, fmt.Sprintf("%s (%s)", h.claim.Name, h.driver))
			errs = append(errs, fmt.Errorf("unprepare %s: %w", h.claim.Name, err))
			fmt.Fprintf(out, "%s: not unprepared (%s): %v\n", h.claim.Name, h.driver, err)
		case h.failed:
			fmt.Fprintf(out, "%s: its prepare failed; rolled back (%s)\n", h.claim.Name, h.driver)
		default:
			fmt.Fprintf(out, "%s: unprepared (%s)\n", h.claim.Name, h.driver)
		}
	}
	ictx, cancel := undoContext(ctx)
	final, _ := env.node.Inventory(ictx)
	cancel()
	printHardwareChanges(out, env.before, final)
	printDaemons(out, env.gpu)
	if err := notRestored(out, env); err != nil {
		errs = append(errs, err)
	}
	if len(kept) > 0 {
		where := fmt.Sprintf("their records are in %s (checkpoint, ledgers, MPS daemons' directories), their CDI specs in %s", env.opts.StateDir, env.opts.CDIDir)
		fmt.Fprintf(out, "left prepared, their unprepare failed: %s\n%s\n", strings.Join(kept, ", "), where)
		errs = append(errs, fmt.Errorf("left prepared, their unprepare failed: %s; %s", strings.Join(kept, ", "), where))
	}
	return len(kept) > 0, errors.Join(errs...)
}

// notRestored lists the GPU and VF settings left changed after every
// claim was unprepared (gpu.Leftovers, nic.Leftovers: the GPU restores log
// their failures and go on, a VF's failed restore keeps its ledger entry),
// each with the setting and what it was, and is an error when there are
// any.
func notRestored(out io.Writer, env undoEnv) error {
	lines, err := gpuprep.Leftovers(env.opts.StateDir)
	if err != nil {
		return fmt.Errorf("reading what is left on the GPUs: %w", err)
	}
	vfs, err := nicprep.Leftovers(env.opts.StateDir)
	if err != nil {
		return fmt.Errorf("reading what is left on the VFs: %w", err)
	}
	for _, v := range vfs {
		lines = append(lines, vfNotRestored(env.node, v))
	}
	if len(lines) == 0 {
		return nil
	}
	fmt.Fprintln(out, "left changed on the hardware (the log above says why):")
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
	return fmt.Errorf("left changed on the hardware: %s", strings.Join(lines, "; "))
}

// vfNotRestored names a VF left changed and its settings that differ from
// what it had, as its PF reads them now; all it had where they cannot be
// read.
func vfNotRestored(node *backend.Node, v nicprep.Leftover) string {
	line := fmt.Sprintf("VF %s (PF %s VF %d): ", v.PCIAddress, v.PF, v.Index)
	if node != nil && node.VFs != nil {
		now, err := node.VFs.GetVF(hw.VFRef{PF: v.PF, Index: v.Index})
		if err == nil {
			if changed := vfChanges(now, v.Original); changed != "" {
				return line + "settings not restored: " + changed
			}
		}
	}
	return line + "settings not restored (was " + vfSettings(v.Original) + ")"
}

// undoContext is a context for one step of the undo: ctx's values
// without its cancellation, bounded by undoTimeout.
func undoContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
}

// interrupted is the error of a run whose context is done.
func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted (%w)", context.Cause(ctx))
}

// Signals stop a lab run: the first cancels the run's context (hwdra's
// main: signal.NotifyContext); the undo then runs to its end whatever
// comes after (NoteRepeatedSignals answers them).
var Signals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// NoteRepeatedSignals answers each of Signals after the first (the one
// that cancels ctx) with a line on out: the lab does not stop undoing
// what it prepared for another, as one that left MPS daemons and MIG
// instances behind would leave the user no way back but hunting them;
// SIGKILL still ends it, and its records then let Undo finish the work.
// stop releases the signals.
func NoteRepeatedSignals(ctx context.Context, out io.Writer) (stop func()) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, Signals...)
	quit := make(chan struct{})
	go func() {
		seen := 0
		if ctx.Err() != nil {
			seen = 1
		}
		for {
			select {
			case s := <-ch:
				if seen++; seen >= 2 {
					fmt.Fprintf(out, "\n%v again: the lab goes on undoing what it prepared (each step bounded by %v); it is not cut short\n", s, undoTimeout)
				}
			case <-quit:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
	}
}
