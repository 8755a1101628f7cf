// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !nomock

package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

func mockCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mock",
		Short: "Work with mock hardware",
	}
	cmd.AddCommand(injectCommand())
	return cmd
}

func injectCommand() *cobra.Command {
	var (
		dir     string
		timeout time.Duration
		f       fault.Fault
		gi, ci  int
		state   string
		procs   []string
	)
	cmd := &cobra.Command{
		Use:   "inject --mock-dir DIR FAULT",
		Short: "Inject a fault into the mock hardware a running process (the agent) uses",
		Long: `Inject a fault into the mock hardware in DIR, the HWDRA_MOCK_DIR of a
running process (an agent on --hardware mock:...), and wait until that
process has applied it.

Faults:
  xid --gpu PCI --code N [--gpu-instance ID [--compute-instance ID]]
                      an XID on the GPU (confined to a MIG instance); the
                      driver asks for a GPU reset unless it is an
                      application XID (13 31 43 45 68 109)
  clear --gpu PCI     the GPU recovers as after a reset
  gpu-lost --gpu PCI  the GPU falls off the bus
  stall --gpu PCI     the GPU stops answering, as one hung in the driver:
                      its health queries block and its events are held
                      (the agent's GPU health monitor stalls on it)
  resume --gpu PCI    a stalled GPU answers again; the held events arrive
  link --pf NAME --state down|up
                      a PF's link (netdev name or PCI address) goes down
                      or up; with veth stand-ins (root) the kernel sees it
  vf-refuse --pf NAME [--setting SETTING]
                      the PF's driver refuses one setting of its VFs
                      (MAC, VLAN, rate, spoofchk, trust, node GUID,
                      port GUID, MTU, link state) with EPERM; no
                      --setting: it takes them all again
  driver --state loaded
                      the NVIDIA driver is loaded (NVML appears)
  processes --gpu PCI [--process PID:MEMORY[:mps]]...
                      the processes NVML lists on the GPU, replacing those
                      before (no --process: none); MEMORY is a quantity
                      (24Gi), :mps marks an MPS client; a process that ran
                      here when set drops out of the list when it exits`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{string(fault.XID), string(fault.Clear), string(fault.GPULost), string(fault.Stall), string(fault.Resume), string(fault.Link), string(fault.VFRefuse), string(fault.Driver), string(fault.Processes)},
		RunE: func(cmd *cobra.Command, args []string) error {
			f.Kind = fault.Kind(args[0])
			if err := completeFault(cmd, &f, gi, ci, state, procs); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if err := fault.InjectDir(ctx, dir, f); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "injected %s\n", f)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&dir, "mock-dir", "", "the mock hardware's directory (the running process's "+persist.DirEnv+")")
	fl.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the process to apply the fault")
	fl.StringVar(&f.GPU, "gpu", "", "the GPU's PCI address (xid, clear, gpu-lost, stall, resume, processes)")
	fl.Uint64Var(&f.XID, "code", 0, "the XID (xid)")
	fl.IntVar(&gi, "gpu-instance", -1, "confine the XID to this MIG GPU instance ID (xid)")
	fl.IntVar(&ci, "compute-instance", -1, "and to this compute instance ID in it (xid)")
	fl.StringVar(&f.PF, "pf", "", "the PF's netdev name or PCI address (link, vf-refuse)")
	fl.StringVar(&f.Setting, "setting", "", "the VF setting the PF refuses (vf-refuse; none: it takes them all)")
	fl.StringVar(&state, "state", "", "down or up (link); loaded (driver)")
	fl.StringArrayVar(&procs, "process", nil, "PID:MEMORY[:mps], a process on the GPU with the GPU memory it holds (24Gi), :mps for an MPS client; repeat for more (processes)")
	_ = cmd.MarkFlagRequired("mock-dir")
	return cmd
}

// completeFault checks that a fault has the flags it needs, and only those.
func completeFault(cmd *cobra.Command, f *fault.Fault, gi, ci int, state string, procs []string) error {
	need := map[fault.Kind][]string{
		fault.XID:       {"gpu", "code"},
		fault.Clear:     {"gpu"},
		fault.GPULost:   {"gpu"},
		fault.Stall:     {"gpu"},
		fault.Resume:    {"gpu"},
		fault.Link:      {"pf", "state"},
		fault.VFRefuse:  {"pf"},
		fault.Driver:    {"state"},
		fault.Processes: {"gpu"},
	}
	allowed := map[fault.Kind][]string{fault.XID: {"gpu-instance", "compute-instance"}, fault.Processes: {"process"}, fault.VFRefuse: {"setting"}}
	flags, ok := need[f.Kind]
	if !ok {
		return fmt.Errorf("unknown fault %q: want xid, clear, gpu-lost, stall, resume, link, vf-refuse, driver or processes", f.Kind)
	}
	for _, name := range flags {
		if !cmd.Flags().Changed(name) {
			return fmt.Errorf("%s needs --%s", f.Kind, name)
		}
	}
	for _, name := range []string{"gpu", "code", "gpu-instance", "compute-instance", "pf", "state", "process", "setting"} {
		if cmd.Flags().Changed(name) && !contains(flags, name) && !contains(allowed[f.Kind], name) {
			return fmt.Errorf("%s takes no --%s", f.Kind, name)
		}
	}
	if gi >= 0 {
		f.GPUInstance = &gi
	}
	if ci >= 0 {
		if gi < 0 {
			return fmt.Errorf("--compute-instance needs --gpu-instance")
		}
		f.ComputeInstance = &ci
	}
	switch {
	case f.Kind == fault.Link && (state == "up" || state == "down"):
		f.Up = state == "up"
	case f.Kind == fault.Link:
		return fmt.Errorf("link: --state %q is not down or up", state)
	case f.Kind == fault.Driver && state == "loaded":
		f.Up = true
	case f.Kind == fault.Driver:
		return fmt.Errorf("driver: --state %q is not loaded (a driver in use cannot be unloaded)", state)
	case f.Kind == fault.Processes:
		var err error
		f.Processes, err = parseProcesses(procs)
		return err
	}
	return nil
}

// parseProcesses reads --process values: PID:MEMORY[:mps].
func parseProcesses(values []string) ([]hw.GPUProcess, error) {
	out := make([]hw.GPUProcess, 0, len(values))
	for _, v := range values {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 || len(parts) == 3 && parts[2] != "mps" {
			return nil, fmt.Errorf("--process %q: want PID:MEMORY or PID:MEMORY:mps (1234:24Gi:mps)", v)
		}
		pid, err := strconv.ParseUint(parts[0], 10, 32)
		if err != nil || pid == 0 {
			return nil, fmt.Errorf("--process %q: PID %q is not a process ID above 0", v, parts[0])
		}
		q, err := resource.ParseQuantity(parts[1])
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("--process %q: memory %q is not a size like 24Gi", v, parts[1])
		}
		mem := uint64(q.Value())
		out = append(out, hw.GPUProcess{PID: uint32(pid), UsedMemory: &mem, MPS: len(parts) == 3})
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
