// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"k8s.io/utils/ptr"
)

func env(vars ...string) []byte { return []byte(strings.Join(vars, "\x00") + "\x00") }

// TestLimitsOf: the MPS limits a client started with, as MPS reads them.
func TestLimitsOf(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name    string
		environ []byte
		memory  *uint64
		threads *float64
	}{
		{"as a share's container gets it", env("PATH=/bin", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"), u(20 << 30), f(40)},
		{"G and a second device", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=2G,0=20G"), u(20 << 30), nil},
		{"MB and spaces", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT= 0 = 512MB "), u(512 << 20), nil},
		{"bytes", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1048576"), u(1 << 20), nil},
		{"raised by the process", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100000M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"), u(100000 << 20), f(100)},
		{"fractional percentage", env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12.5"), nil, f(12.5)},
		{"unset: no limit", env("PATH=/bin"), nil, nil},
		{"empty (env -i)", []byte{}, nil, nil},
		{"unreadable value: no limit", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=lots", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=all"), nil, nil},
		{"device 0 missing", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1=20G"), nil, nil},
		{"zero and overflow", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=0M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=0"), nil, nil},
		{"overflow", env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=99999999999999999T"), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := limitsOf(tc.environ)
			if !eq(l.memory, tc.memory) || !eq(l.threads, tc.threads) {
				t.Errorf("limitsOf = memory %v threads %v; want %v, %v", deref(l.memory), deref(l.threads), deref(tc.memory), deref(tc.threads))
			}
		})
	}
}

func eq[T comparable](a, b *T) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

func deref[T any](p *T) any {
	if p == nil {
		return "none"
	}
	return *p
}

// TestScanStream: the environment read in pieces of any size finds what
// reading it whole finds; entries that straddle the buffer are whole;
// the first entry of a name counts, as getenv(3) takes it; what lies past
// the cap is not read, and the reading says it was cut.
func TestScanStream(t *testing.T) {
	pad := strings.Repeat("p", envChunk-len("PAD=")-10)
	full := env("PAD="+pad, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G")
	for name, r := range map[string]func() io.Reader{
		"whole":    func() io.Reader { return bytes.NewReader(full) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(full)) },
		"halves":   func() io.Reader { return iotest.HalfReader(bytes.NewReader(full)) },
	} {
		var s envScanner
		l, err := s.scan(r(), int64(len(full)))
		if err != nil || !eq(l.memory, ptr.To(uint64(20<<30))) || !eq(l.threads, ptr.To(40.0)) || l.cut || l.read != int64(len(full)) {
			t.Errorf("%s: memory %v threads %v cut %v read %d, %v", name, deref(l.memory), deref(l.threads), l.cut, l.read, err)
		}
		// The same scanner again: nothing carried over.
		l, err = s.scan(bytes.NewReader(env("PATH=/bin")), 1<<20)
		if err != nil || l.memory != nil || l.threads != nil {
			t.Errorf("%s, second scan: memory %v threads %v, %v", name, deref(l.memory), deref(l.threads), err)
		}
	}

	var s envScanner
	at := int64(len("PAD=") + len(pad) + 1 + len("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M") + 1 + len("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=4"))
	l, err := s.scan(bytes.NewReader(full), at)
	if err != nil || !eq(l.memory, ptr.To(uint64(20<<30))) || l.threads != nil || !l.cut || l.read != at {
		t.Errorf("cut inside an entry: memory %v threads %v cut %v read %d, %v", deref(l.memory), deref(l.threads), l.cut, l.read, err)
	}
	long := env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=4"+strings.Repeat("0", maxValue), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10")
	if l := limitsOf(long); l.threads != nil {
		t.Errorf("a value too long to be read: threads %v, want none (the first entry counts)", *l.threads)
	}
	if l := limitsOf(env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGEX=10", "CUDA_MPS=1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10")); !eq(l.threads, ptr.To(10.0)) {
		t.Errorf("names that only start alike: threads %v", deref(l.threads))
	}
}

// TestWorsen: a process's reads kept at their worst; none is the worst.
func TestWorsen(t *testing.T) {
	l := startLimits{memory: ptr.To(uint64(10)), threads: ptr.To(40.0), read: 5}
	l.worsen(startLimits{memory: ptr.To(uint64(5)), threads: ptr.To(100.0), read: 7})
	if *l.memory != 10 || *l.threads != 100 || l.cut || l.read != 7 {
		t.Errorf("worsen: %v %v %v %d", *l.memory, *l.threads, l.cut, l.read)
	}
	l.worsen(startLimits{threads: ptr.To(1.0), cut: true})
	if l.memory != nil || *l.threads != 100 || !l.cut {
		t.Errorf("worsen with none: %v %v %v", deref(l.memory), deref(l.threads), l.cut)
	}
	l.worsen(startLimits{memory: ptr.To(uint64(1)), threads: ptr.To(1.0)})
	if l.memory != nil {
		t.Errorf("none went back to a limit: %v", *l.memory)
	}
}
