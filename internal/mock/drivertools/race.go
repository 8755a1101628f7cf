// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build race

package drivertools

// raceBuild: built with the race detector, whose exit with status 0
// sleeps atexit_sleep_ms first (a second unless GORACE says otherwise).
const raceBuild = true
