package police

import (
	"strings"
	"testing"
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
