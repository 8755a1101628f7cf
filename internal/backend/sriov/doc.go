// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package sriov is the real NIC backend: it finds SR-IOV physical functions
// and their VFs in sysfs (rooted at a configurable directory, so tests and
// the mock point it at a fake tree) plus netlink (default routes, devlink
// eswitch mode), and applies VF settings through netlink.
//
// sriovnet is not used for discovery: every one of its sysfs helpers reads
// fixed /sys paths through a process-global filesystem, so none honours a
// per-call root. This package reads the few files it needs itself.
package sriov
