// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestAgentWaitsForItsAPIServer: `hwdra agent` takes its kubeconfig from
// $KUBECONFIG (no --kubeconfig, and no warning about a --master flag it
// does not have). While nothing answers at the server's address (a closed
// port on loopback) it says so at the default verbosity, naming the
// server and where its address came from, and /readyz says it; once the
// real API server answers there, the agent says so, publishes and is
// ready.
func TestAgentWaitsForItsAPIServer(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	creds, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	real, err := url.Parse(creds.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	addr := closedPort(t)
	data, err := os.ReadFile(creds.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(strings.Replace(string(data), creds.Config.Host, "https://"+addr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	metrics := closedPort(t)
	var args []string
	for _, a := range n.AgentArgs(creds.Kubeconfig, "mock:cx7") {
		if !strings.HasPrefix(a, "--kubeconfig=") {
			args = append(args, a)
		}
	}
	args = append(args, "--nri-socket=", "--metrics-address="+metrics)
	t.Cleanup(func() { n.DeleteResourceSlices(context.Background()) })
	agent := n.StartProcess(t, "hwdra-agent", framework.HwdraBinary(t), args...)

	for _, want := range []string{"Warning: cannot reach the API server", `server="https://` + addr + `" from="$KUBECONFIG ` + kubeconfig + `"`} {
		if err := agent.WaitLog(ctx, 0, want, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	unreachable := "the API server https://" + addr + " ($KUBECONFIG " + kubeconfig + ") is unreachable for "
	if body := waitReadyz(t, metrics, func(body string) bool { return strings.Contains(body, unreachable) }); body == "" {
		t.Errorf("/readyz does not name the API server")
	}

	forward(t, addr, real.Host)
	if err := agent.WaitLog(ctx, 0, "The API server answers again", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitResourceSlices(ctx, device.NICDriver, time.Minute); err != nil {
		t.Fatal(err)
	}
	if body := waitReadyz(t, metrics, func(body string) bool { return body == "ok\n" }); body == "" {
		t.Errorf("not ready once the API server answers")
	}
	if log := agent.Tail(1000); strings.Contains(log, "--master") {
		t.Errorf("the agent speaks of a --master flag it does not have:\n%s", log)
	}
}

// closedPort is a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// forward listens on addr and relays each connection to target, until t
// ends.
func forward(t *testing.T, addr, target string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go io.Copy(s, c)
				io.Copy(c, s)
			}()
		}
	}()
}

// waitReadyz polls /readyz until ok holds for its body (returned) or a
// minute passes ("").
func waitReadyz(t *testing.T, addr string, ok func(string) bool) string {
	t.Helper()
	var last string
	if err := waitfor.Until(t.Context(), "/readyz as expected", time.Minute, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			last = err.Error()
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(body)
		return ok(last)
	}); err != nil {
		t.Logf("%v: /readyz last said: %q", err, last)
		return ""
	}
	return last
}
