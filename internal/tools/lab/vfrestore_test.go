// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/fault"
)

// injectEnv makes the test binary a fault injector (the command a lab run
// executes while its claims are prepared): it injects the fault in the
// value ({"dir": mock dir, "fault": ...}) into the running lab's mock
// hardware and exits. Checked in init, before TestMain.
const injectEnv = "HWDRA_LAB_TEST_INJECT"

func init() {
	spec := os.Getenv(injectEnv)
	if spec == "" {
		return
	}
	var in struct {
		Dir   string      `json:"dir"`
		Fault fault.Fault `json:"fault"`
	}
	err := json.Unmarshal([]byte(spec), &in)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = fault.InjectDir(ctx, in.Dir, in.Fault)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inject:", err)
		os.Exit(1)
	}
	fmt.Println("injected", in.Fault)
	os.Exit(0)
}

// TestLabReportsAVFRestoreFailure: a VF whose rate limit its PF refuses to
// set back (the driver takes no rate change any more while the claim was
// prepared) is named in the summary with its PF, its number and the
// setting left changed, and the run fails.
func TestLabReportsAVFRestoreFailure(t *testing.T) {
	profile := writeLabProfile(t, "nics:\n- model: cx7\n  count: 1\n  vfs: 4\n")
	var pf string
	d := persistentMock(t, profile, func(h *mock.Hardware) error {
		pf = h.NICs().Netdevs()[0]
		return nil
	})
	spec, _ := json.Marshal(map[string]any{"dir": d.mock, "fault": fault.Fault{Kind: fault.VFRefuse, PF: pf, Setting: "rate"}})
	t.Setenv(injectEnv, string(spec))
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:" + profile, StateDir: d.state, CDIDir: d.cdi,
		ClaimFiles: examples("vf-share-10g.yaml"), Exec: []string{os.Args[0]}})
	got := withoutLogs(out.String())
	wantOutput(t, got, "injected PF "+pf+" refuses VF setting rate", "left changed on the hardware (the log above says why):\n  VF ")
	line := regexp.MustCompile(`(?m)^  VF \S+ \(PF ` + regexp.QuoteMeta(pf) + ` VF \d+\): settings not restored: max tx rate 10000 Mb/s \(was none\), min tx rate 10000 Mb/s \(was none\)`)
	if !line.MatchString(got) {
		t.Errorf("the summary names no VF with its PF and the rate it was left at:\n%s", got)
	}
	if err == nil || !regexp.MustCompile(`left changed on the hardware: VF \S+ \(PF `+regexp.QuoteMeta(pf)).MatchString(err.Error()) {
		t.Errorf("error %v, want the VF left changed", err)
	}
	if t.Failed() || strings.Contains(got, "panic") {
		t.Log(out.String())
	}
}
