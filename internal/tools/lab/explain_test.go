// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLabExplainsMIGInTheWayOfVGPUs: on a vGPU host whose two GPUs
// each got a MIG partition for an earlier claim, vgpu.yaml fits the empty
// node but not beside it; the lab names each GPU, the claims and
// partitions in the way, and why: MIG partitions and vGPUs of one GPU
// exclude each other (their compatibility groups), not "the claims hold
// every device".
func TestLabExplainsMIGInTheWayOfVGPUs(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{
		Hardware:   "mock:h100-vgpu",
		ClaimFiles: examples("mig-on-distinct-gpus.yaml", "vgpu.yaml"),
	})
	if err == nil {
		t.Fatalf("vgpu.yaml allocated beside MIG partitions on both GPUs:\n%s", out.String())
	}
	msg := err.Error()
	for _, gpu := range []string{"0000:1b:00.0", "0000:43:00.0"} {
		set := "gpu-" + strings.NewReplacer(":", "-", ".", "-").Replace(gpu)
		line := regexp.MustCompile(`(?m)^ +GPU ` + regexp.QuoteMeta(gpu) + ` \(counter set ` + set + `\): claim mig-on-distinct-gpus holds ` +
			set + `-mig-1g-10gb-\d; they share no compatibility group with the 32 matching devices there \(theirs: mig; these: vgpu-mig, vgpu-timesliced\): MIG partitions and vGPUs of one GPU exclude each other$`)
		if !line.MatchString(msg) {
			t.Errorf("no line names GPU %s, the MIG partition and claim in the way and why:\n%s", gpu, msg)
		}
	}
	wantOutput(t, msg, "claim vgpu, request vgpu: those claims keep out all 64 devices that match it:")
	if strings.Contains(msg, "hold every device") {
		t.Errorf("the vGPU's refusal still blames the claims holding every device:\n%s", msg)
	}
}

// TestLabExplainsCountersInTheWay: 4 x 3g.40gb take every memory slice of
// both GPUs of the vGPU host; a 1g.10gb claim after them finds no partition held, but
// the slices used up, and the lab says which claim uses which.
func TestLabExplainsCountersInTheWay(t *testing.T) {
	dir := t.TempDir()
	big := claimYAML("big", `exactly: {deviceClassName: mig.gpu.hwdra.io, count: 4, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "3g.40gb"'}}]}`)
	small := claimYAML("small", `exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}}]}`)
	for name, text := range map[string]string{"a.yaml": big, "b.yaml": small} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:h100-vgpu", ClaimFiles: []string{dir}})
	if err == nil {
		t.Fatalf("1g.10gb allocated beside 4 x 3g.40gb on 2 GPUs:\n%s", out.String())
	}
	msg := err.Error()
	wantOutput(t, msg, "claim small, request gpu: those claims keep out all 14 devices that match it:")
	for _, gpu := range []string{"0000:1b:00.0", "0000:43:00.0"} {
		set := "gpu-" + strings.NewReplacer(":", "-", ".", "-").Replace(gpu)
		line := regexp.MustCompile(`(?m)^ +GPU ` + regexp.QuoteMeta(gpu) + ` \(counter set ` + set + `\): claim big holds ` + set + `-mig-3g-40gb-\d and ` +
			set + `-mig-3g-40gb-\d; they use up memory-slice-\d \(1 of 1 used\).*, which the 7 matching devices there need$`)
		if !line.MatchString(msg) {
			t.Errorf("no line names GPU %s, the partitions and claim using up its memory slices:\n%s", gpu, msg)
		}
	}
}

// TestLabExplainsDevicesHeld: every 1g.10gb partition of the vGPU host's
// two GPUs is held by an earlier claim; the next one is told so, with
// the claim that holds them.
func TestLabExplainsDevicesHeld(t *testing.T) {
	dir := t.TempDir()
	sel := `selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}}]`
	for name, text := range map[string]string{
		"a.yaml": claimYAML("all", `exactly: {deviceClassName: mig.gpu.hwdra.io, count: 14, `+sel+`}`),
		"b.yaml": claimYAML("one-more", `exactly: {deviceClassName: mig.gpu.hwdra.io, `+sel+`}`),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:h100-vgpu", ClaimFiles: []string{dir}})
	if err == nil {
		t.Fatalf("a 15th 1g.10gb allocated on 2 GPUs:\n%s", out.String())
	}
	wantOutput(t, err.Error(), "claim one-more, request gpu: those claims keep out all 14 devices that match it:\n"+
		"            14 matching devices held by claims allocated before: all (14)")
}
