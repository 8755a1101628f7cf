// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package prepare is the kubelet side of a driver: a kubeletplugin.DRAPlugin
// that turns allocated claims into prepared devices through a Driver (GPU or
// NIC), recording every side effect in a crash-safe checkpoint so that a
// failed or interrupted prepare is rolled back and nothing leaks.
package prepare
