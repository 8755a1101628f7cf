package mock

// validate checks one GPU group; errors start with the field name.
// (Filled in by the GPU mock work.)
func (g GPUGroup) validate() error { return nil }

// buildGPUs creates h.NVML and the GPUs' sysfs entries.
func (h *Hardware) buildGPUs() error { return nil }
