// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// TestConvertCommand: a partial conversion fails and writes nothing
// unless --allow-partial; what was not converted is on stderr either way.
func TestConvertCommand(t *testing.T) {
	in := filepath.Join("..", "..", "internal", "tools", "convert", "testdata", "unmapped.yaml")
	out := filepath.Join(t.TempDir(), "out.yaml")
	run := func(args ...string) (string, error) {
		if err := logsapi.ResetForTest(nil); err != nil {
			t.Fatal(err)
		}
		root := newRootCommand()
		var stderr bytes.Buffer
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&stderr)
		root.SilenceUsage = true
		root.SetArgs(append([]string{"convert", "-f", in, "-o", out}, args...))
		err := root.Execute()
		return stderr.String(), err
	}
	stderr, err := run()
	if err == nil || !strings.Contains(err.Error(), "4 things not converted") {
		t.Errorf("error %v", err)
	}
	if !strings.Contains(stderr, "not converted: "+in+": ResourceClaim odd/by-brand: spec.devices.requests[0].exactly.selectors[0].cel.expression: attribute gpu.nvidia.com/brand") {
		t.Errorf("stderr:\n%s", stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("output written without --allow-partial")
	}
	if _, err := run("--allow-partial"); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(out); err != nil || !bytes.Contains(data, []byte("driver: gpu.hwdra.io")) {
		t.Errorf("%v:\n%s", err, data)
	}
}
