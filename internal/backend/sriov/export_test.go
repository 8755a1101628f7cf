// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

// Stepwise makes n move links with separate requests, as on a kernel that
// refuses a rename with the move.
func Stepwise(n *Netns) { n.stepwise = true }
