// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package hw is the hardware model: plain types for what a node has, filled
// by a backend (nvml, sriov) from real or mock hardware and read by slices and
// prepare. It imports no backend and no Kubernetes API package.
package hw
