// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package e2e runs hwdra against a real single-node Kubernetes: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd and
// the kubelet, each the real binary (built by hack/build-realnode.sh), inside
// a network namespace the run creates. Only the hardware is mocked.
//
//	hack/build-realnode.sh                      # prints the bin directory
//	HWDRA_REALNODE_BIN=<dir> go test ./test/e2e/ -v
//
// Needs root. Without HWDRA_REALNODE_BIN every test skips with the reason.
package e2e

import (
	"testing"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

func TestMain(m *testing.M) { framework.Main(m) }
