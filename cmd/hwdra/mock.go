//go:build !nomock

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hwdra/hwdra/mock/fault"
	"github.com/hwdra/hwdra/mock/persist"
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
  link --pf NAME --state down|up
                      a PF's link (netdev name or PCI address) goes down
                      or up; with veth stand-ins (root) the kernel sees it
  driver --state loaded
                      the NVIDIA driver is loaded (NVML appears)`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{string(fault.XID), string(fault.Clear), string(fault.GPULost), string(fault.Link), string(fault.Driver)},
		RunE: func(cmd *cobra.Command, args []string) error {
			f.Kind = fault.Kind(args[0])
			if err := completeFault(cmd, &f, gi, ci, state); err != nil {
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
	fl.StringVar(&f.GPU, "gpu", "", "the GPU's PCI address (xid, clear, gpu-lost)")
	fl.Uint64Var(&f.XID, "code", 0, "the XID (xid)")
	fl.IntVar(&gi, "gpu-instance", -1, "confine the XID to this MIG GPU instance ID (xid)")
	fl.IntVar(&ci, "compute-instance", -1, "and to this compute instance ID in it (xid)")
	fl.StringVar(&f.PF, "pf", "", "the PF's netdev name or PCI address (link)")
	fl.StringVar(&state, "state", "", "down or up (link); loaded (driver)")
	_ = cmd.MarkFlagRequired("mock-dir")
	return cmd
}

// completeFault checks that a fault has the flags it needs, and only those.
func completeFault(cmd *cobra.Command, f *fault.Fault, gi, ci int, state string) error {
	need := map[fault.Kind][]string{
		fault.XID:     {"gpu", "code"},
		fault.Clear:   {"gpu"},
		fault.GPULost: {"gpu"},
		fault.Link:    {"pf", "state"},
		fault.Driver:  {"state"},
	}
	allowed := map[fault.Kind][]string{fault.XID: {"gpu-instance", "compute-instance"}}
	flags, ok := need[f.Kind]
	if !ok {
		return fmt.Errorf("unknown fault %q: want xid, clear, gpu-lost, link or driver", f.Kind)
	}
	for _, name := range flags {
		if !cmd.Flags().Changed(name) {
			return fmt.Errorf("%s needs --%s", f.Kind, name)
		}
	}
	for _, name := range []string{"gpu", "code", "gpu-instance", "compute-instance", "pf", "state"} {
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
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
