// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !race

package drivertools

// raceBuild: built with the race detector (race.go).
const raceBuild = false
