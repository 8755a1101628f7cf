// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

// GPUProcess is a process with a context on a GPU, as the driver lists it.
type GPUProcess struct {
	// PID is in the host's PID namespace (the agent runs with hostPID).
	PID uint32 `json:"pid"`
	// UsedMemory is the GPU memory the process holds, in bytes; nil where
	// the driver does not tell (NVML_VALUE_NOT_AVAILABLE: under vGPU
	// guests and on some older drivers).
	UsedMemory *uint64 `json:"usedMemory,omitempty"`
	// MPS: the process is an MPS client (listed by
	// nvmlDeviceGetMPSComputeRunningProcesses); false: a context of its
	// own on the GPU, or the MPS server.
	MPS bool `json:"mps,omitempty"`
	// GPUInstance is the MIG GPU instance it runs in; nil outside MIG.
	GPUInstance *int `json:"gpuInstance,omitempty"`
}
