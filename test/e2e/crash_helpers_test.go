// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// Shared by the crash_* scenarios: the agent on mock hardware that
// outlives it (persist.DirEnv), so that what a killed agent leaves on the
// "hardware" is still there for the restarted one, and for the test to
// compare with what was there before.

// hwRig is one agent on persistent mock hardware of the shared node, with
// a state directory of its own and a namespace.
type hwRig struct {
	t        *testing.T
	n        *framework.Node
	ctx      context.Context
	ns       string
	hardware string
	drivers  []string
	// MockDir holds the hardware's state; StateDir is the agent's
	// --state-dir (checkpoints, ledgers).
	mockDir, stateDir string
	agent             *framework.Process
	agentLog          int64 // the agent's log size when it last started
}

// startHWRig starts the agent on persistent mock hardware with extra
// environment (mock timings), waits until drivers are published and
// registered with the kubelet, and makes a namespace. When t ends, pass
// or fail, the agent runs again if it was left killed, every pod and claim
// of the namespace is deleted and unprepared, the agent stops and the
// hardware's directory goes.
func startHWRig(t *testing.T, name, hardware string, env []string, drivers ...string) *hwRig {
	t.Helper()
	n := framework.Shared(t)
	r := &hwRig{t: t, n: n, ctx: context.Background(), hardware: hardware, drivers: drivers}
	r.mockDir = n.MockDir(t)
	var err error
	if r.stateDir, err = os.MkdirTemp(n.Root, "agent-state-"); err != nil {
		t.Fatal(err)
	}
	since := n.KubeletLogSize()
	r.agentLog = n.LogSize("hwdra-agent")
	r.agent = n.StartAgentWithEnv(t, hardware, append([]string{persist.DirEnv + "=" + r.mockDir}, env...), "--state-dir="+r.stateDir)
	r.waitServing(since)
	r.ns = n.CreateNamespace(t, name)
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), r.ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	// Runs first: a test that failed with the agent killed leaves nobody
	// to unprepare the claims.
	t.Cleanup(func() {
		if !r.agent.Running() {
			r.agent.Env = framework.AgentEnv(persist.DirEnv + "=" + r.mockDir)
			if err := r.agent.Start(); err != nil {
				t.Errorf("cleanup: restart the agent: %v", err)
			}
		}
	})
	return r
}

// waitServing waits until every driver's pools are complete and the
// kubelet has registered it (after log offset since).
func (r *hwRig) waitServing(since int64) {
	r.t.Helper()
	for _, d := range r.drivers {
		if _, err := r.n.WaitPoolsComplete(r.ctx, d, 60*time.Second); err != nil {
			r.t.Fatal(err)
		}
		if d == nicDriver {
			if err := r.agent.WaitLog(r.ctx, r.agentLog, framework.NRISynced, 30*time.Second); err != nil {
				r.t.Fatal(err)
			}
		}
		if err := r.n.WaitDriverRegistered(r.ctx, d, since, 30*time.Second); err != nil {
			r.t.Fatal(err)
		}
	}
}

// kill SIGKILLs the agent: the crash it must survive.
func (r *hwRig) kill() {
	r.agent.Kill()
	r.t.Logf("agent killed (SIGKILL)")
}

// restart starts the killed agent again: the same binary, flags, state
// directory and mock directory; env replaces the extra environment given
// to startHWRig (nil: the hardware at full speed).
func (r *hwRig) restart(env []string) {
	r.t.Helper()
	r.agent.Env = framework.AgentEnv(append([]string{persist.DirEnv + "=" + r.mockDir}, env...)...)
	r.agentLog = r.n.LogSize("hwdra-agent")
	if err := r.agent.Start(); err != nil {
		r.t.Fatal(err)
	}
}

// state reads the mock hardware's persisted state.
func (r *hwRig) state() persist.State {
	r.t.Helper()
	s, err := persist.ReadState(r.mockDir)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// template creates a ResourceClaimTemplate from deploy/examples/<file>.
func (r *hwRig) template(file string) string {
	r.t.Helper()
	claim, err := framework.ExampleClaim(file)
	if err != nil {
		r.t.Fatal(err)
	}
	tmpl := framework.TemplateFor(claim)
	if _, err := r.n.Admin.ResourceV1().ResourceClaimTemplates(r.ns).Create(r.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	return tmpl.Name
}

// createPod creates a test-app pod using a claim from the template, its
// app showing paths, and returns when it was created.
func (r *hwRig) createPod(name, template string, paths ...string) time.Time {
	r.t.Helper()
	pod := framework.PodWithClaimTemplate(name, template, paths...)
	began := time.Now()
	if _, err := r.n.Admin.CoreV1().Pods(r.ns).Create(r.ctx, pod, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	return began
}

// waitRunning waits until the pod runs, logs "TIMING <scenario> <creation
// -> Running>", and returns its claim and its app's output.
func (r *hwRig) waitRunning(name, scenario string, since time.Time) (*resourceapi.ResourceClaim, framework.AppOutput) {
	r.t.Helper()
	if _, err := r.n.WaitPodRunning(r.ctx, r.ns, name, 120*time.Second); err != nil {
		r.t.Fatal(err)
	}
	framework.Timing(r.t, scenario, time.Since(since))
	claim, _, err := r.n.WaitPodClaimAllocated(r.ctx, r.ns, name, 10*time.Second)
	if err != nil {
		r.t.Fatal(err)
	}
	logs, err := r.n.WaitPodLogs(r.ctx, r.ns, name, "app", "=== END", 20*time.Second)
	if err != nil {
		r.t.Fatal(err)
	}
	return claim, framework.ParseAppOutput(logs)
}

// podEvents are the pod's events, "<reason>: <message>", oldest first.
func (r *hwRig) podEvents(name string) []string {
	list, err := r.n.Admin.CoreV1().Events(r.ns).List(r.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

// deletePodAndCheck deletes the pod and waits until its claim is
// unprepared without a trace: the hardware's state is before's again (no
// GPU instance, mediated device or changed VF left, MIG modes restored),
// the agent's checkpoint holds no claim and its ledger no hardware state
// of driver, and no CDI spec or metadata of the claim is left on the node.
// It logs "TIMING <scenario> <deletion -> all that>".
func (r *hwRig) deletePodAndCheck(name, driver, scenario string, claim *resourceapi.ResourceClaim, before persist.State) {
	r.t.Helper()
	began := time.Now()
	if err := r.n.DeletePod(r.ctx, r.ns, name, 60*time.Second); err != nil {
		r.t.Fatal(err)
	}
	what := fmt.Sprintf("claim %s of pod %s unprepared without a trace after the pod was deleted", claim.Name, name)
	waitfor.NoError(r.t, what, 30*time.Second, func() error {
		var problems []string
		s, err := persist.ReadState(r.mockDir)
		if err != nil {
			problems = append(problems, err.Error())
		} else if d := framework.HardwareDiff(before, s); d != "" {
			problems = append(problems, "the hardware is not as before the pod (- before, + now):\n"+d)
		}
		rec, err := framework.ReadAgentRecords(r.stateDir, driver)
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case len(rec.Claims) > 0:
			problems = append(problems, "claims left in the agent's checkpoint: "+mapString(rec.Claims))
		case len(rec.Ledger) > 0:
			problems = append(problems, "hardware state left in the agent's ledger: "+strings.Join(rec.Ledger, ", "))
		case len(rec.Placements) > 0:
			problems = append(problems, "VFs the agent still has in pods: "+strings.Join(rec.Placements, ", "))
		}
		if files := r.n.ClaimFiles(driver, claim.Namespace, claim.Name, string(claim.UID)); len(files) > 0 {
			problems = append(problems, "CDI specs or metadata of the claim left: "+strings.Join(files, ", "))
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "\n"))
		}
		return nil
	})
	framework.Timing(r.t, scenario, time.Since(began))
}

func mapString(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ", ")
}
