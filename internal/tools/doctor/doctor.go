// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package doctor is `hwdra doctor`: what the agent would find on a node
// and what blocks it, each finding with its fix. Each check is a small
// function over the node's hardware (backend.Node, the same code the
// agent runs), the agent's configuration and paths and, where one is
// given, an API client; Run gathers them into a Report, which renders as
// text or JSON. Nothing on the node is changed: no directory is made, no
// setting written, and the API server gets a dry run only.
package doctor

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
)

// Status is a check's outcome.
type Status string

const (
	// OK: nothing in the way.
	OK Status = "OK"
	// Warn: the agent runs, but something it offers or does is lost.
	Warn Status = "WARN"
	// Blocker: the agent cannot serve (all of) the node until it is
	// fixed.
	Blocker Status = "BLOCKER"
	// Skip: not checked (not on this node, or nothing to check it with),
	// the summary says why.
	Skip Status = "SKIP"
)

// Check is one finding.
type Check struct {
	// ID names the check, stable across versions ("nvml", "kubelet-dirs").
	ID     string `json:"id"`
	Status Status `json:"status"`
	// Summary is what was found, in a line.
	Summary string `json:"summary"`
	// Details are what the summary stands on: per GPU, PF, file.
	Details []string `json:"details,omitempty"`
	// Fix is what to do, for anything not OK.
	Fix string `json:"fix,omitempty"`
}

// Report is every check, in the order they run.
type Report struct {
	Checks []Check `json:"checks"`
}

// Count is how many checks have the status.
func (r Report) Count(s Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == s {
			n++
		}
	}
	return n
}

// WriteText writes the report for people: a line per check (status, id,
// summary), under a check that is not OK its details and fix (under
// every check with details), and the count of blockers and warnings.
func (r Report) WriteText(w io.Writer, details bool) error {
	var b strings.Builder
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-7s  %-15s  %s\n", c.Status, c.ID, c.Summary)
		if details || c.Status == Warn || c.Status == Blocker {
			for _, d := range c.Details {
				fmt.Fprintf(&b, "%26s- %s\n", "", d)
			}
		}
		if c.Fix != "" && c.Status != OK {
			fmt.Fprintf(&b, "%26sfix: %s\n", "", c.Fix)
		}
	}
	fmt.Fprintf(&b, "%d blocker(s), %d warning(s)\n", r.Count(Blocker), r.Count(Warn))
	_, err := io.WriteString(w, b.String())
	return err
}

// Input is what the checks look at.
type Input struct {
	// Node is the node's hardware, opened as the agent opens it.
	Node *backend.Node
	// Config is the AgentConfig; nil: the defaults.
	Config *config.AgentConfig
	// Paths are the agent's paths on the node.
	Paths Paths
	// CDIHook is --nvidia-cdi-hook; "": none given.
	CDIHook string
	// NodeName names the node in the feature check's dry-run slice.
	NodeName string
	// API is how to reach the API server.
	API API
}

// Paths are the agent's folders and sockets on the node, as its flags
// give them.
type Paths struct {
	RegistrarDir, PluginsDir, CDIDir, NRISocket, StateDir string
}

// API is the API server to check. Without a Client the API checks are
// skipped, saying why: Err (a kubeconfig that could not be used), or none
// found.
type API struct {
	Client kubernetes.Interface
	// Server names the server and where its address came from, for
	// messages.
	Server string
	Err    error
}

// Run runs every check.
func Run(ctx context.Context, in Input) Report {
	if in.Config == nil {
		in.Config = config.Default()
	}
	// What the code the checks call logs, they say themselves.
	ctx = klog.NewContext(ctx, logr.Discard())
	r := &run{in: in}
	r.gather(ctx)
	var rep Report
	for _, check := range []func(context.Context) Check{
		r.nvml, r.driverRoot, r.driverVersion, r.driverFiles, r.cdiHook, r.migMode, r.computeMode, r.mpsDaemons, r.deviceNodes,
		r.passthrough, r.vfioNoIOMMU, r.sriov, r.nri, r.kubeletDirs, r.cdiDir, r.stateDir,
	} {
		rep.Checks = append(rep.Checks, check(ctx))
	}
	rep.Checks = append(rep.Checks, r.api(ctx)...)
	return rep
}

// run is one run's input and what more than one check reads, read once.
type run struct {
	in Input
	// gpu is NVML once up; nvmlErr why it is not, on a node whose PCI bus
	// shows GPUs for the NVIDIA driver (nil without).
	gpu     *nvml.Backend
	nvmlErr error
	gpus    []hw.GPU
	gpusErr error
	pfs     []hw.PF
	pfsErr  error
	offers  []config.NICOffer
	skips   []config.Skip
	// driverFiles is what the driver files check found, for the hook's.
	filesFromToolkit bool
}

func (r *run) gather(ctx context.Context) {
	n := r.in.Node
	if n.NVMLPending() {
		// Once more, as the agent retries: the error says why.
		r.nvmlErr = n.InitNVML()
	}
	if r.gpu = n.GPU(); r.gpu != nil {
		r.gpus, r.gpusErr = r.gpu.GPUs(ctx)
	}
	r.pfs, r.pfsErr = sriov.Discover(n.NIC)
	r.offers, r.skips = r.in.Config.Resolve(r.pfs)
}

// pendingNVML: the PCI bus shows GPUs for the NVIDIA driver, but NVML is
// not up.
func (r *run) pendingNVML() bool { return r.gpu == nil && r.nvmlErr != nil }

// noDriverNeeded is the summary of a check that is about the NVIDIA
// driver on a node without GPUs for it.
const noDriverNeeded = "no GPU for the NVIDIA driver on this node: nothing to check"

// skipWithoutNVML skips a check that needs NVML up, saying why; false
// where NVML is up.
func (r *run) skipWithoutNVML(c *Check) bool {
	switch {
	case r.gpu != nil:
		return false
	case r.pendingNVML():
		c.Status, c.Summary = Skip, "NVML is not up (see nvml): looked at once it is"
	default:
		c.Status, c.Summary = Skip, noDriverNeeded
	}
	return true
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
