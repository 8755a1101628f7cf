// Package config is the agent's configuration file: which SR-IOV PFs the
// agent offers, in which mode, with which bandwidth policy, and how device
// faults are judged and tainted.
//
//	apiVersion: config.hwdra.io/v1alpha1
//	kind: AgentConfig
//	nics:
//	- select:                 # all given fields must match; a list matches any entry
//	    names: [ens1f0np0]    # PF netdev names
//	    pciAddresses: ["0000:17:00.0"]
//	    vendorIDs: ["15b3"]   # quoted hex
//	    deviceIDs: ["1021"]
//	    drivers: [mlx5_core]
//	  mode: shared            # shared (default) | exclusive | disabled
//	  bandwidth:              # shared mode only; bits per second
//	    default: 10G
//	    minimum: 1G
//	    step: 1G
//	health:
//	  xids:
//	    ignore: [63]          # no device failure here, besides 13 31 43 45 68 109
//	    report: [43]          # a device failure here after all
//	  fatalEffect: NoExecute  # NoSchedule (default) | NoExecute
//
// The first entry whose select matches a PF decides for it; a PF no entry
// selects is not offered, and an entry without select matches every PF. A
// PF that carries one of the node's default routes is only offered by an
// entry that names it explicitly (select.names or select.pciAddresses):
// handing the management link to pods must be a deliberate act.
//
// Bandwidth values are Kubernetes quantities in bits per second with
// decimal suffixes ("10G" is 10 Gb/s, "500M" 500 Mb/s) and must be whole
// Mb/s: Mb/s is the unit of the kernel's VF rate limit, which enforces the
// share at prepare, so the scheduler counts exactly what the wire gets.
// Defaults: minimum 1G and step 1G; given only one of minimum and step,
// the other takes its value (the valid shares are its multiples); default
// 10G, rounded up to a valid share. A shared PF publishes capacity
// "sriov.hwdra.io/bandwidth" = link speed with that request policy, and
// "sriov.hwdra.io/vfs" = its VF count with each share taking one VF; a
// claim's capacity request names them so.
//
// Without a file (no --config) every PF with VFs is offered in shared mode
// with those defaults, except the PFs that carry a default route.
//
// health: a GPU XID is a device failure unless it is an application XID
// (the built-in 13, 31, 43, 45, 68, 109, plus xids.ignore, minus
// xids.report); where the driver reports NVML's GPU recovery action, a
// failure XID still needs the driver to ask for a recovery action. Fatal
// faults (GPU lost, reset needed, uncorrectable memory errors) taint the
// device with fatalEffect, every other fault NoSchedule.
//
// Decoding is strict: unknown fields, wrong types and bad values are errors
// that name the field ("nics[1].bandwidth.step: must be > 0"), and a file
// with any error yields no configuration at all.
package config
