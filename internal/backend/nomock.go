// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build nomock

package backend

import (
	"fmt"

	"k8s.io/klog/v2"
)

// openMock: this build has no simulator. The agent's image is built so
// (-tags nomock): a node agent on customers' hardware carries none of it.
func openMock(spec string, _ klog.Logger) (*Node, error) {
	return nil, fmt.Errorf("--hardware %s%s: this hwdra was built without the hardware simulator (-tags nomock, as the agent's image is): run mock hardware from a full build, `go run ./cmd/hwdra ...` in the repository", MockPrefix, spec)
}

func mockProfiles() string { return " (no built-in mock profiles in this build: -tags nomock)" }
