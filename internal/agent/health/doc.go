// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package health watches the node's devices and says what is wrong with
// them: the GPU monitor listens to NVML events (XID errors, double-bit ECC,
// a GPU unavailable, recovery actions) and checks every GPU periodically;
// the NIC monitor listens to netlink link events and checks every PF's link
// periodically. Their findings (hw.Health) are tainted in the published
// slices and streamed to the kubelet (Stream: WatchHealthStatus), and
// disappear when the hardware recovers.
package health
