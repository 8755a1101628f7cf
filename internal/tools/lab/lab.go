// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package lab runs the whole pipeline on one machine without a cluster:
// probe the hardware, build the slices, allocate claims with the
// scheduler's allocator, prepare them for real and show the result.
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/api"
	"github.com/hwdra/hwdra/internal/agent"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// NodeName is the node the lab pretends to be.
const NodeName = "lab"

// Options are the lab command's settings.
type Options struct {
	Hardware   string
	ConfigPath string
	// ValuesFiles are the chart's values files (helm's -f): the lab
	// allocates with the DeviceClasses the chart renders with them
	// instead of its default rendering.
	ValuesFiles []string
	// ClaimFiles are files and directories of claims; "-" reads Stdin.
	ClaimFiles []string
	Stdin      io.Reader
	// Keep leaves the claims prepared (state in StateDir) instead of
	// unpreparing them at the end, where every claim prepared: a run that
	// fails or is interrupted is undone all the same. The run prints the
	// command that undoes them (Undo).
	Keep bool
	// StateDir and CDIDir default to a temporary directory.
	StateDir, CDIDir string
	// Exec is a command (hwdra lab's words after "--") run while the
	// claims are prepared, before they are unprepared, with ExecCDIDirEnv
	// and ExecCDIDevicesEnv: a container emulated from the claims' CDI
	// specs (hack/cdirun), a test of the hardware.
	Exec []string
	// CDIHook is nvidia-cdi-hook for the hooks of the driver files
	// generated for containers; empty: the one beside hwdra, if any.
	CDIHook string
}

// run is one lab run's state, shared by its steps.
type run struct {
	out  io.Writer
	opts Options
	// tmp is the temporary directory of StateDir and CDIDir, if the run
	// made one; left: prepared claims stay in it (Keep, or an undo that
	// could not finish), and with them their state and CDI specs.
	tmp  string
	left bool
	node *backend.Node
	// inv is the hardware before prepare, modesBefore its compute modes.
	inv         hw.Inventory
	modesBefore map[string]nvml.ComputeMode
	drivers     agent.Drivers
	// handed are the claims handed to prepare: the undo's list.
	handed []handedClaim
}

// Run does the pipeline and reports each step to out. What the agent's
// parts log goes to out too, in its place among the steps, each line
// marked "log:".
//
// The lab never leaves hardware changed: once a claim was handed to
// prepare, whatever happens next (a claim that fails to prepare, any
// other error, ctx cancelled: hwdra lab's SIGINT or SIGTERM, once or
// more) everything prepared is unprepared, last first, on contexts of its
// own that ctx does not cancel (undo.go). Only a run in which every claim
// prepared keeps them under Keep, and says how to undo them (Undo).
func Run(ctx context.Context, out io.Writer, opts Options) (err error) {
	ctx = withLogger(ctx, out)
	classes, groups, err := readInput(out, opts)
	if err != nil {
		return err
	}
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	r := &run{out: out, opts: opts}
	if err := r.makeDirs(); err != nil {
		return err
	}
	defer r.removeTemp()
	if r.node, err = backend.OpenWith(opts.Hardware, backend.Options{Logger: klog.FromContext(ctx)}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.node.Close()) }()
	objs := r.publish(ctx, cfg)
	claims, results, err := r.allocate(ctx, objs, classes, groups)
	if err != nil || len(claims) == 0 {
		return errors.Join(err, notAllocated(results))
	}
	defer func() { err = errors.Join(err, notAllocated(results)) }()
	if ctx.Err() != nil {
		return interrupted(ctx) // the allocations above may be cut short: nothing is prepared
	}
	if r.drivers, err = agent.NewDrivers(ctx, r.node, r.inv, agent.PluginOptions{StateDir: r.opts.StateDir, CDIDir: r.opts.CDIDir, Published: published(r.inv), Config: cfg, NodeName: NodeName, CDIHook: cdiHook(opts.CDIHook)}); err != nil {
		return err
	}
	// From the first prepare on, every way out goes through the undo.
	defer func() { err = r.finish(ctx, err) }()
	return r.prepareAndShow(ctx, claims)
}

// withLogger makes the agent's parts log to out, each line marked "log:".
func withLogger(ctx context.Context, out io.Writer) context.Context {
	return klog.NewContext(ctx, textlogger.NewLogger(textlogger.NewConfig(
		textlogger.Output(&linePrefixer{w: out, prefix: "log: "}), textlogger.WithHeader(false))))
}

// readInput reads the claims of the files and the DeviceClasses the lab
// allocates with (the chart's, rendered with ValuesFiles if any, and the
// files'), their notes shown.
func readInput(out io.Writer, opts Options) ([]*resourceapi.DeviceClass, []claimGroup, error) {
	classes, valuesNotes, err := chartClasses(opts.ValuesFiles)
	if err != nil {
		return nil, nil, err
	}
	groups, classes, notes, err := readClaims(opts.ClaimFiles, opts.Stdin, classes)
	notes = append(valuesNotes, notes...)
	if len(notes) > 0 {
		section(out, "Manifests")
		for _, n := range notes {
			fmt.Fprintln(out, n)
		}
	}
	return classes, groups, err
}

// makeDirs makes the temporary directory of the state and CDI
// directories not given.
func (r *run) makeDirs() error {
	if r.opts.StateDir != "" && r.opts.CDIDir != "" {
		return nil
	}
	tmp, err := os.MkdirTemp("", "hwdra-lab-")
	if err != nil {
		return err
	}
	r.tmp = tmp
	if r.opts.StateDir == "" {
		r.opts.StateDir = filepath.Join(tmp, "state")
	}
	if r.opts.CDIDir == "" {
		r.opts.CDIDir = filepath.Join(tmp, "cdi")
	}
	return nil
}

// removeTemp removes the temporary directory unless claims are left in
// it (their records).
func (r *run) removeTemp() {
	if r.tmp != "" && !r.left {
		os.RemoveAll(r.tmp)
	}
}

// publish probes the hardware and builds the slices the agent would
// publish, shown.
func (r *run) publish(ctx context.Context, cfg *config.AgentConfig) []*resourceapi.ResourceSlice {
	out := r.out
	inv, err := r.node.Inventory(ctx)
	if err != nil {
		fmt.Fprintf(out, "warning: some devices could not be read: %v\n", err)
	}
	r.inv = inv
	r.modesBefore = computeModes(r.node, inv) // "Hardware after prepare" shows what changed
	res, skipped := resources.ForNode(NodeName, inv, cfg, device.AllFeatures, hw.Health{})
	var objs []*resourceapi.ResourceSlice
	section(out, "Hardware and slices")
	fmt.Fprintf(out, "%d GPU(s), %d bound to vfio-pci, %d SR-IOV PF(s)\n", len(inv.GPUs), len(inv.PassthroughGPUs), len(inv.PFs))
	if r.node.GPU() != nil || r.node.NVMLPending() {
		fmt.Fprintln(out, r.node.Driver())
	}
	for _, driver := range sortedKeys(res) {
		n := 0
		for _, s := range resources.Objects(driver, NodeName, res[driver]) {
			objs = append(objs, &s)
			n += len(s.Spec.Devices)
		}
		fmt.Fprintf(out, "%s: %d devices in %d slices\n", driver, n, len(res[driver].Pools[NodeName].Slices))
	}
	for _, s := range skipped {
		fmt.Fprintf(out, "not offered: %s\n", s)
	}
	return objs
}

// allocate allocates the groups' claims with the scheduler's allocator
// and shows the result: the claims allocated, in order.
func (r *run) allocate(ctx context.Context, objs []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, groups []claimGroup) ([]*resourceapi.ResourceClaim, []allocation, error) {
	out := r.out
	results := allocateGroups(ctx, objs, classes, groups)
	section(out, "Allocation (the scheduler's allocator)")
	var (
		claims  []*resourceapi.ResourceClaim
		refused []error
	)
	for _, res := range results {
		if len(res.why) > 0 {
			fmt.Fprintf(out, "%s: not allocated (why: at the end)\n", res.group.name)
			continue
		}
		for _, c := range res.group.claims {
			if err := printYAML(out, map[string]any{c.Name: c.Status.Allocation.Devices.Results}); err != nil {
				return nil, results, err
			}
			for _, note := range capacityNotes(c) {
				fmt.Fprintln(out, note)
			}
			// A config no driver reads: the agent refuses the claim at
			// prepare; every such config of every claim is said here.
			for _, u := range api.UnappliedConfigs(c) {
				refused = append(refused, fmt.Errorf("claim %s: %s", c.Name, u))
			}
		}
		claims = append(claims, res.group.claims...)
	}
	if len(refused) > 0 {
		return nil, results, fmt.Errorf("the agent refuses these claims at prepare:\n  %w", errors.Join(refused...))
	}
	return claims, results, nil
}

// prepareAndShow prepares the claims, driver by driver, shows the
// hardware as prepare left it and runs Options.Exec.
func (r *run) prepareAndShow(ctx context.Context, claims []*resourceapi.ResourceClaim) error {
	for name, plugin := range r.drivers.All() {
		mine := claimsOf(claims, name)
		if len(mine) == 0 {
			continue
		}
		if err := prepareClaims(ctx, r.out, name, plugin, mine, r.opts, &r.handed); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	after, _ := r.node.Inventory(ctx)
	section(r.out, "Hardware after prepare")
	printHardwareChanges(r.out, r.inv, after)
	printSettings(r.out, r.node, after, r.modesBefore, r.drivers)
	printDaemons(r.out, r.drivers.GPU)
	if len(r.opts.Exec) > 0 {
		return execute(ctx, r.out, r.opts, r.handed)
	}
	return nil
}

// finish ends a run that handed claims to prepare: it keeps them (Keep,
// after a run in which every claim prepared) or undoes them, and reports
// what is left and how to undo it. err is the run's error.
func (r *run) finish(ctx context.Context, err error) error {
	if len(r.handed) == 0 {
		return err
	}
	if err == nil && ctx.Err() != nil {
		err = interrupted(ctx)
	}
	if err == nil && r.opts.Keep {
		fmt.Fprintf(r.out, "\nKept prepared: state in %s, CDI specs in %s\n", r.opts.StateDir, r.opts.CDIDir)
		r.left = true
		return r.recordKept()
	}
	var undoErr error
	r.left, undoErr = undo(ctx, r.out, err, r.handed, undoEnv{opts: r.opts, node: r.node, before: r.inv, gpu: r.drivers.GPU})
	if r.left {
		undoErr = errors.Join(undoErr, r.recordKept())
	}
	return errors.Join(err, undoErr)
}

// Environment of Options.Exec's command.
const (
	// ExecCDIDirEnv is the directory of the claims' CDI specs.
	ExecCDIDirEnv = "HWDRA_LAB_CDI_DIR"
	// ExecCDIDevicesEnv are the claims' CDI devices, comma-separated, the
	// names a runtime injects them by (gpu.hwdra.io/claim=...).
	ExecCDIDevicesEnv = "HWDRA_LAB_CDI_DEVICES"
)

// execute runs Options.Exec while the claims are prepared: a container
// emulated from their CDI specs (hack/cdirun), a test of the hardware. Its
// output goes in a section of its own; a failure fails the run (after
// which the claims are undone as after any failure).
func execute(ctx context.Context, out io.Writer, opts Options, handed []handedClaim) error {
	section(out, "Exec: "+strings.Join(opts.Exec, " "))
	var ids []string
	for _, h := range handed {
		ids = append(ids, h.cdi...)
	}
	cmd := exec.CommandContext(ctx, opts.Exec[0], opts.Exec[1:]...)
	cmd.Env = append(os.Environ(), ExecCDIDirEnv+"="+opts.CDIDir, ExecCDIDevicesEnv+"="+strings.Join(ids, ","))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s (run while the claims were prepared): %w", opts.Exec[0], err)
	}
	return nil
}

// printDaemons shows the MPS control daemons running for shared GPUs.
func printDaemons(out io.Writer, gpu *agent.GPU) {
	if gpu == nil {
		return
	}
	ids := gpu.MPS.IDs()
	if len(ids) == 0 {
		fmt.Fprintln(out, "no MPS control daemons")
	}
	for _, id := range ids {
		s, _ := gpu.MPS.Spec(id)
		owner := "claim " + s.Owner
		switch {
		case s.Owner == mps.OwnerShares:
			owner = "the GPU's policed shares"
		case s.Share:
			owner = "the dedicated share of claim " + s.Owner
		}
		defaults := "no defaults"
		if s.ActiveThreadPercentage != nil || s.PinnedMemoryLimit != nil {
			defaults = "defaults " + strings.Join(s.Commands(), ", ")
		}
		fmt.Fprintf(out, "MPS control daemon %s (PID %d) for %s: devices %s, %s, pipe directory %s\n", id, gpu.MPS.PID(id), owner, strings.Join(s.Devices, ","), defaults, gpu.MPS.Dirs(id).Pipe)
	}
}

// prepareClaims prepares a driver's claims one at a time, each noted in
// handed before it is handed to the plugin (the undo's list), and starts
// none once ctx is done.
func prepareClaims(ctx context.Context, out io.Writer, driver string, plugin kubeletplugin.DRAPlugin, claims []*resourceapi.ResourceClaim, opts Options, handed *[]handedClaim) error {
	section(out, "Prepare: "+driver)
	if driver == device.NICDriver {
		// No container runtime here: nothing to move a VF into.
		fmt.Fprintln(out, "note: no NRI here (as the agent with --nri-socket=): VF netdevs stay in the host network namespace, their metadata has no networkData")
	}
	for _, c := range claims {
		if ctx.Err() != nil {
			return interrupted(ctx)
		}
		*handed = append(*handed, handedClaim{driver: driver, plugin: plugin, claim: c})
		results, err := plugin.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err == nil {
			err = results[c.UID].Err
		}
		if err != nil {
			(*handed)[len(*handed)-1].failed = true
			if ctx.Err() != nil {
				return fmt.Errorf("%w, preparing %s: %w", interrupted(ctx), c.Name, err)
			}
			return fmt.Errorf("prepare %s: %w", c.Name, err)
		}
		r := results[c.UID]
		type shown struct {
			Request    string                                 `json:"request"`
			Device     string                                 `json:"device"`
			CDIDevices []string                               `json:"cdiDevices,omitempty"`
			Metadata   map[string]resourceapi.DeviceAttribute `json:"metadata,omitempty"`
		}
		var devs []shown
		for _, dev := range r.Devices {
			(*handed)[len(*handed)-1].cdi = append((*handed)[len(*handed)-1].cdi, dev.CDIDeviceIDs...)
			s := shown{Request: strings.Join(dev.Requests, ","), Device: dev.DeviceName, CDIDevices: dev.CDIDeviceIDs}
			if dev.Metadata != nil {
				s.Metadata = dev.Metadata.Attributes
			}
			devs = append(devs, s)
		}
		if err := printYAML(out, map[string]any{c.Name: devs}); err != nil {
			return err
		}
		path := filepath.Join(opts.CDIDir, driver+"_claim_"+string(c.UID)+".json")
		if spec, err := readSpec(path); err == nil {
			fmt.Fprintf(out, "CDI spec of %s (%s):\n", c.Name, path)
			if err := printYAML(out, spec); err != nil {
				return err
			}
		}
	}
	return nil
}

// readSpec reads a claim's CDI spec for showing: the checkpoint entry it
// keeps in an annotation (one long line of JSON, for rebuilding a lost
// state directory) is named, not shown; --keep leaves the file.
func readSpec(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, err
	}
	if ann, ok := spec["annotations"].(map[string]any); ok {
		if entry, ok := ann[prepare.ClaimAnnotation].(string); ok {
			ann[prepare.ClaimAnnotation] = fmt.Sprintf("(checkpoint entry, %d bytes: rebuilds a lost state directory)", len(entry))
		}
	}
	return spec, nil
}

// printHardwareChanges shows the state prepare changes: MIG mode and GPU
// instances.
func printHardwareChanges(out io.Writer, before, now hw.Inventory) {
	was := map[string]hw.GPU{}
	for _, g := range before.GPUs {
		was[g.PCIBusID] = g
	}
	changed := false
	for _, g := range now.GPUs {
		b := was[g.PCIBusID]
		if b.MIG.Enabled == g.MIG.Enabled && len(b.MIG.Instances) == len(g.MIG.Instances) {
			continue
		}
		changed = true
		fmt.Fprintf(out, "GPU %s: MIG %s, %d GPU instance(s)", g.PCIBusID, onOff(g.MIG.Enabled), len(g.MIG.Instances))
		for _, in := range g.MIG.Instances {
			if p, ok := g.MIG.Profile(in.ProfileID); ok {
				fmt.Fprintf(out, " [%s at slice %d]", p.Name, in.Placement.Start)
			}
		}
		fmt.Fprintln(out)
	}
	if !changed {
		fmt.Fprintln(out, "no GPU instances or MIG modes differ from the start")
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func claimsOf(claims []*resourceapi.ResourceClaim, driver string) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, c := range claims {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driver {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

func section(out io.Writer, title string) { fmt.Fprintf(out, "\n== %s ==\n", title) }

func printYAML(out io.Writer, v any) error {
	y, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(y)
	return err
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// linePrefixer writes prefix before each line.
type linePrefixer struct {
	w       io.Writer
	prefix  string
	midLine bool
}

func (p *linePrefixer) Write(b []byte) (int, error) {
	var buf []byte
	for _, c := range b {
		if !p.midLine {
			buf = append(buf, p.prefix...)
		}
		buf = append(buf, c)
		p.midLine = c != '\n'
	}
	if _, err := p.w.Write(buf); err != nil {
		return 0, err
	}
	return len(b), nil
}

// published is what the lab "publishes": the node as probed, with every
// feature (prepare.Published).
type published hw.Inventory

func (p published) Current() (hw.Inventory, device.Features) {
	return hw.Inventory(p), device.AllFeatures
}

// cdiHook is the hook the lab's CDI specs name: the one given, else the
// one shipped beside hwdra (the lab runs on the node: its path is the
// node's).
func cdiHook(given string) string {
	if given != "" {
		return given
	}
	return driverlibs.ShippedHook()
}
