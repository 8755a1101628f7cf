// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package resources turns a hardware inventory into the ResourceSlices the
// agent publishes (package slices/device names what they contain).
// Everything here is pure: the same inventory gives byte-identical output,
// and nothing touches hardware or the API server.
package resources
