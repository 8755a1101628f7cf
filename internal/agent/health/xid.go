// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"fmt"
	"slices"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// applicationXIDs are the XIDs NVIDIA documents as the program's fault
// (a bad memory access, a timeout, an engine exception): the device is
// fine, the process is not.
var applicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// xidInfo is what NVIDIA's XID catalog says of an XID: its meaning and
// whether the GPU needs a reset (or more) to be usable again.
type xidInfo struct {
	meaning string
	fatal   bool
}

var xids = map[uint64]xidInfo{
	13:  {"graphics engine exception", false},
	31:  {"GPU memory page fault", false},
	43:  {"GPU stopped processing", false},
	45:  {"preemptive cleanup after previous errors", false},
	48:  {"double-bit ECC error", true},
	61:  {"internal micro-controller breakpoint or warning", false},
	62:  {"internal micro-controller halt", true},
	63:  {"ECC page retirement or row remapping recorded", false},
	64:  {"ECC page retirement or row remapping failure", true},
	68:  {"video processor exception", false},
	69:  {"graphics engine class error", false},
	74:  {"NVLink error", true},
	79:  {"GPU has fallen off the bus", true},
	92:  {"high single-bit ECC error rate", false},
	94:  {"contained ECC error", false},
	95:  {"uncontained ECC error", true},
	109: {"context switch timeout", false},
	119: {"GSP RPC timeout", true},
	120: {"GSP error", true},
	121: {"C2C link corrected error", false},
	140: {"unrecovered ECC error", true},
	154: {"GPU recovery action changed", false},
}

// XIDPolicy says which XIDs are device failures: all but the application
// XIDs, adjusted by the configuration.
type XIDPolicy struct {
	ignored map[uint64]bool
}

// NewXIDPolicy applies a configuration's health.xids to the built-in
// application XIDs.
func NewXIDPolicy(p config.HealthPolicy) XIDPolicy {
	ignored := map[uint64]bool{}
	for _, x := range append(slices.Clone(applicationXIDs), p.IgnoreXIDs...) {
		ignored[x] = true
	}
	for _, x := range p.ReportXIDs {
		delete(ignored, x)
	}
	return XIDPolicy{ignored: ignored}
}

// Ignored reports whether an XID is no device failure.
func (p XIDPolicy) Ignored(xid uint64) bool { return p.ignored[xid] }

// describeXID is "XID 79 (GPU has fallen off the bus)".
func describeXID(xid uint64) string {
	if info, ok := xids[xid]; ok {
		return fmt.Sprintf("XID %d (%s)", xid, info.meaning)
	}
	return fmt.Sprintf("XID %d", xid)
}

// fatalXID: without the driver's recovery action, an XID the catalog
// says needs a reset is fatal; an unknown one is not.
func fatalXID(xid uint64) bool { return xids[xid].fatal }

// fatalAction: a recovery action that takes the GPU away from its work.
func fatalAction(a hw.GPURecoveryAction) bool {
	switch a {
	case hw.RecoveryNone, hw.RecoveryDrainP2P, hw.RecoveryRecoverIMEXDomain:
		return false
	}
	return true
}
