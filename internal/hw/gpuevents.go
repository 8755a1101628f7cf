// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

import "time"

// GPUEventKind is what a GPU reported.
type GPUEventKind string

const (
	// GPUEventXID: an XID error (the driver's error code, in XID).
	GPUEventXID GPUEventKind = "xid"
	// GPUEventDoubleBitECC: an uncorrectable (double-bit) memory error.
	GPUEventDoubleBitECC GPUEventKind = "ecc-double-bit"
	// GPUEventUnavailable: the GPU became unavailable (NVML's
	// GpuUnavailableError, or an event wait answering "GPU is lost").
	GPUEventUnavailable GPUEventKind = "unavailable"
	// GPUEventRecoveryAction: the driver's recovery action changed.
	GPUEventRecoveryAction GPUEventKind = "recovery-action"
)

// GPUEvent is one event a GPU reported, as the GPU backend delivers it.
type GPUEvent struct {
	// PCIBusID is empty when the backend cannot tell which GPU (every GPU
	// should then be checked).
	PCIBusID string
	Kind     GPUEventKind
	// XID is the XID of a GPUEventXID.
	XID uint64
	// Partition is the placement of the MIG GPU instance the event is
	// confined to; nil for the whole GPU.
	Partition *Placement
	// RecoveryAction is the driver's recovery action for the GPU, read
	// right after the event; nil where the driver does not report one.
	RecoveryAction *GPURecoveryAction
	Time           time.Time
}

// GPUCheck is one GPU's answer to a periodic health check.
type GPUCheck struct {
	Index int
	// PCIBusID is empty when the GPU did not tell.
	PCIBusID string
	// Lost: the GPU fell off the bus (NVML's ERROR_GPU_IS_LOST).
	Lost bool
	// Error is any other failure to read the GPU.
	Error string
	// RecoveryAction: nil where the driver does not report one.
	RecoveryAction *GPURecoveryAction
}

// GPURecoveryAction is NVML's GPU recovery action field
// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): what the driver says it takes to
// make the GPU usable again.
type GPURecoveryAction uint32

// NVML's values (nvmlDeviceGpuRecoveryAction_t).
const (
	RecoveryNone              GPURecoveryAction = 0
	RecoveryGPUReset          GPURecoveryAction = 1
	RecoveryNodeReboot        GPURecoveryAction = 2
	RecoveryDrainP2P          GPURecoveryAction = 3
	RecoveryDrainAndReset     GPURecoveryAction = 4
	RecoveryRecoverIMEXDomain GPURecoveryAction = 5
	RecoveryBusReset          GPURecoveryAction = 6
	RecoverySystemReboot      GPURecoveryAction = 7
)

func (a GPURecoveryAction) String() string {
	switch a {
	case RecoveryNone:
		return "none"
	case RecoveryGPUReset:
		return "GPU reset"
	case RecoveryNodeReboot:
		return "node reboot"
	case RecoveryDrainP2P:
		return "drain peer-to-peer traffic"
	case RecoveryDrainAndReset:
		return "drain peer-to-peer traffic and reset the GPU"
	case RecoveryRecoverIMEXDomain:
		return "recover the IMEX domain"
	case RecoveryBusReset:
		return "PCIe bus reset"
	case RecoverySystemReboot:
		return "system reboot"
	}
	return "unknown action"
}
