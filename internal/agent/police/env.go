package police

import (
	"bytes"
	"strconv"
	"strings"
)

// The MPS client environment a share's container gets (mps.ClientEdits).
const (
	threadsEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	memoryEnv  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// startLimits are the MPS limits a client started with, on its device 0
// (a share's container sees one GPU); nil: none, so the daemon's default,
// and a share's daemon has none.
type startLimits struct {
	memory  *uint64 // bytes
	threads *float64
}

// limitsOf reads a process's /proc/<pid>/environ: the environment it was
// started with (a change it makes later is not there).
//
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is "<device>=<size>[,...]" with sizes
// such as "20480M" or "20G" (binary units, as MPS reads them); a value MPS
// could not read limits nothing, and is taken as no limit.
func limitsOf(environ []byte) startLimits {
	var l startLimits
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case threadsEnv:
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 {
				l.threads = &f
			}
		case memoryEnv:
			l.memory = deviceZeroMemory(v)
		}
	}
	return l
}

// deviceZeroMemory is device 0's size in a pinned memory limit.
func deviceZeroMemory(v string) *uint64 {
	for entry := range strings.SplitSeq(v, ",") {
		dev, size, ok := strings.Cut(strings.TrimSpace(entry), "=")
		if !ok || strings.TrimSpace(dev) != "0" {
			continue
		}
		if b, ok := parseSize(strings.TrimSpace(size)); ok {
			return &b
		}
	}
	return nil
}

// parseSize reads "20480M", "20G", "512MB", "1048576" (bytes).
func parseSize(s string) (uint64, bool) {
	s = strings.TrimSuffix(strings.ToUpper(s), "B")
	shift := 0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			s = s[:n-1]
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 || v > (^uint64(0))>>shift {
		return 0, false
	}
	return v << shift, true
}
