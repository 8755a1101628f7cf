// Package slices turns a hardware inventory into the ResourceSlices the agent
// publishes. Everything here is pure: the same inventory gives byte-identical
// output, and nothing touches hardware or the API server.
package slices

// Driver names.
const (
	GPUDriver = "gpu.hwdra.io"
	NICDriver = "sriov.hwdra.io"
)
