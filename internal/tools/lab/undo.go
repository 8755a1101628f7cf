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
// (the logger) without its cancellation, bounded by undoTimeout and
// cancelled by env.opts.Abort. cause is why the run ends (nil: it
// succeeded). It prints what it undid, the hardware and MPS daemons that
// still differ from the start, and, where it had to stop, which claims it
// left and where their records are; left reports that some are.
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
	aborted := func() bool { return env.opts.Abort != nil && env.opts.Abort.Err() != nil }
	var (
		kept []string
		errs []error
	)
	for i := len(handed) - 1; i >= 0; i-- {
		h := handed[i]
		name := fmt.Sprintf("%s (%s)", h.claim.Name, h.driver) // as named in what is left
		if aborted() {
			kept = append(kept, name)
			continue
		}
		uctx, cancel := undoContext(ctx, env.opts.Abort)
		results, err := h.plugin.UnprepareResourceClaims(uctx, []kubeletplugin.NamespacedObject{
			{NamespacedName: types.NamespacedName{Namespace: h.claim.Namespace, Name: h.claim.Name}, UID: h.claim.UID}})
		cancel()
		if err == nil {
			err = results[h.claim.UID]
		}
		switch {
		case err != nil:
			kept = append(kept, name)
			errs = append(errs, fmt.Errorf("unprepare %s: %w", h.claim.Name, err))
			fmt.Fprintf(out, "%s: not unprepared (%s): %v\n", h.claim.Name, h.driver, err)
		case h.failed:
			fmt.Fprintf(out, "%s: its prepare failed; rolled back (%s)\n", h.claim.Name, h.driver)
		default:
			fmt.Fprintf(out, "%s: unprepared (%s)\n", h.claim.Name, h.driver)
		}
	}
	ictx, cancel := undoContext(ctx, nil)
	final, _ := env.node.Inventory(ictx)
	cancel()
	printHardwareChanges(out, env.before, final)
	printDaemons(out, env.gpu)
	if len(kept) == 0 {
		return false, nil
	}
	why := "their unprepare failed"
	if aborted() {
		why = fmt.Sprintf("the undo was stopped: %v", context.Cause(env.opts.Abort))
	}
	where := fmt.Sprintf("their records are in %s (checkpoint, ledgers, MPS daemons' directories), their CDI specs in %s", env.opts.StateDir, env.opts.CDIDir)
	fmt.Fprintf(out, "left prepared, %s: %s\n%s\n", why, strings.Join(kept, ", "), where)
	return true, errors.Join(append(errs, fmt.Errorf("left prepared, %s: %s; %s", why, strings.Join(kept, ", "), where))...)
}

// undoContext is a context for one step of the undo: ctx's values
// without its cancellation, bounded by undoTimeout, done with abort.
func undoContext(ctx, abort context.Context) (context.Context, context.CancelFunc) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	if abort == nil {
		return uctx, cancel
	}
	stop := context.AfterFunc(abort, cancel)
	return uctx, func() { stop(); cancel() }
}

// interrupted is the error of a run whose context is done.
func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted (%w)", context.Cause(ctx))
}

// Signals stop a lab run: the first cancels the run's context (hwdra's
// main: signal.NotifyContext), the next the undo after it
// (AbortOnSecondSignal).
var Signals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// AbortOnSecondSignal returns Options.Abort for a run whose ctx the
// first of Signals cancels: a context done at the signal after that one
// (at the first, where ctx is done already). stop releases the signals.
func AbortOnSecondSignal(ctx context.Context) (abort context.Context, stop func()) {
	abort, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, Signals...)
	seen := 0
	if ctx.Err() != nil {
		seen = 1
	}
	quit := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				if seen++; seen >= 2 {
					cancel(fmt.Errorf("a second signal (%v)", s))
					return
				}
			case <-quit:
				return
			}
		}
	}()
	return abort, func() {
		signal.Stop(ch)
		close(quit)
		cancel(nil)
	}
}
