// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestAgentBuildsRSS compares the resident memory of hwdra builds, each
// run as the agent process on a mock DGX H100 against the same API server
// once it has published: HWDRA_E2E_RSS_BINS="name=/path/hwdra,..." (skipped
// without). It logs "RSS <name> dgx-h100 VmRSS: ..." lines per build.
func TestAgentBuildsRSS(t *testing.T) {
	spec := os.Getenv("HWDRA_E2E_RSS_BINS")
	if spec == "" {
		t.Skip("HWDRA_E2E_RSS_BINS is not set (name=/path/to/hwdra,...)")
	}
	n := framework.Shared(t)
	for _, entry := range strings.Split(spec, ",") {
		name, bin, ok := strings.Cut(entry, "=")
		if !ok {
			t.Fatalf("HWDRA_E2E_RSS_BINS entry %q: want name=path", entry)
		}
		t.Run(name, func(t *testing.T) {
			agent := n.StartAgentBinary(t, bin, "mock:dgx-h100", nil)
			for _, d := range []string{gpuDriver, nicDriver} {
				if _, err := n.WaitPoolsComplete(context.Background(), d, 60*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			// The RSS of an agent that has run a while past publishing
			// (informers synced, health checks and rescans run), as a
			// node sees it: real time must pass before the reading.
			time.Sleep(5 * time.Second)
			logRSS(t, name+" dgx-h100", agent.Pid())
		})
	}
}
