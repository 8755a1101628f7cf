// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
)

// The MPS client environment a share's container gets (mps.ClientEdits).
const (
	threadsEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	memoryEnv  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// What the police reads of environments, and the bounds on it. A
// process's environment is tenant input: up to 6 MiB of it (kernel fact:
// exec(2) allows argument and environment strings of up to 3/4 of
// _STK_LIM, 6 MiB, where the stack limit is 24 MiB or more; each string
// up to 128 KiB), and more once a process with CAP_SYS_RESOURCE points
// its environment elsewhere (prctl PR_SET_MM_ENV_START/END). So it is
// read as a stream through one buffer, keeping only the two variables
// above, and never past the caps.
const (
	// envBytesPerProcess is the most of one process's environment the
	// police reads: all that exec(2) lets a process start with.
	envBytesPerProcess = 6 << 20
	// envBytesPerRound: a round starts no further environment read
	// once it has read this much (so it reads at most this plus one
	// process's cap): about 28 ms at the 1.2 GB/s measured here
	// (BenchmarkReadFatEnvironment), 3% of a core at the default interval.
	envBytesPerRound = 32 << 20
	// envChunk is the one buffer's size.
	envChunk = 32 << 10
	// maxValue is the longest value kept: longer is no value MPS reads.
	maxValue = 256
	// maxEntry is the most of one entry kept: the longer name, "=" and
	// the value.
	maxEntry = len(threadsEnv) + 1 + maxValue
)

// startLimits are the MPS limits a client's environment shows, on its
// device 0 (a share's container sees one GPU); nil: none, so the daemon's
// default, and a share's daemon has none.
type startLimits struct {
	memory  *uint64 // bytes
	threads *float64
	// cut: the environment went on past what was read (the cap): a
	// variable not found may lie beyond it.
	cut bool
	// read is how much of the environment was read.
	read int64
}

// worsen keeps in l the higher of each limit in l and o (none is the
// highest): what a process's environment showed at its worst.
func (l *startLimits) worsen(o startLimits) {
	switch {
	case l.memory == nil:
	case o.memory == nil || *o.memory > *l.memory:
		l.memory = o.memory
	}
	switch {
	case l.threads == nil:
	case o.threads == nil || *o.threads > *l.threads:
		l.threads = o.threads
	}
	l.cut = l.cut || o.cut
	l.read = max(l.read, o.read)
}

// envScanner reads environments (/proc/<pid>/environ: NUL-terminated
// NAME=value entries) through one reusable buffer.
type envScanner struct {
	buf   []byte
	entry []byte // the current entry's first bytes (maxEntry at most)
	skip  bool   // the current entry is none of the two: skipped to its NUL
	long  bool   // the current entry is longer than maxEntry
	seen  [2]bool
}

// scan reads r up to limit bytes and returns the limits found. As
// getenv(3) does (and CUDA with it), the first entry of a name counts; a
// later one of the same name is not what the process's CUDA reads. An
// entry the cap cuts is not taken.
func (s *envScanner) scan(r io.Reader, limit int64) (startLimits, error) {
	if s.buf == nil {
		s.buf = make([]byte, envChunk)
		s.entry = make([]byte, 0, maxEntry)
	}
	s.entry, s.skip, s.long, s.seen = s.entry[:0], false, false, [2]bool{}
	var l startLimits
	for l.read < limit {
		n, err := r.Read(s.buf[:min(int64(len(s.buf)), limit-l.read)])
		l.read += int64(n)
		s.feed(s.buf[:n], &l)
		if errors.Is(err, io.EOF) {
			s.end(&l) // the last entry may lack its NUL
			return l, nil
		}
		if err != nil {
			return l, err
		}
	}
	// At the cap: is there more?
	var one [1]byte
	for {
		n, err := r.Read(one[:])
		if n > 0 {
			l.cut = true
			return l, nil
		}
		if errors.Is(err, io.EOF) {
			s.end(&l)
			return l, nil
		}
		if err != nil {
			return l, err
		}
	}
}

// feed takes the next bytes of the environment.
func (s *envScanner) feed(b []byte, l *startLimits) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		part := b
		if i >= 0 {
			part = b[:i]
		}
		s.add(part)
		if i < 0 {
			return
		}
		s.end(l)
		b = b[i+1:]
	}
}

// add takes part of the current entry.
func (s *envScanner) add(part []byte) {
	if s.skip || len(part) == 0 {
		return
	}
	if room := maxEntry - len(s.entry); len(part) > room {
		s.long, part = true, part[:room]
	}
	s.entry = append(s.entry, part...)
	if nameOf(s.entry, true) < 0 {
		s.skip = true
	}
}

// end closes the current entry: one of the two names, the first time,
// sets its limit (a value too long or unreadable: none).
func (s *envScanner) end(l *startLimits) {
	if k := nameOf(s.entry, false); !s.skip && k >= 0 && !s.seen[k] {
		s.seen[k] = true
		v := string(s.entry[len(envNames[k]):])
		switch {
		case s.long:
		case k == 0:
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f > 0 {
				l.threads = &f
			}
		default:
			l.memory = deviceZeroMemory(v)
		}
	}
	s.entry, s.skip, s.long = s.entry[:0], false, false
}

var envNames = [2]string{threadsEnv + "=", memoryEnv + "="}

// nameOf is which of envNames entry starts with (-1: neither); with
// partial, also one that entry, still being read, may yet start with.
func nameOf(entry []byte, partial bool) int {
	for k, name := range envNames {
		n := min(len(entry), len(name))
		if string(entry[:n]) != name[:n] {
			continue
		}
		if n == len(name) || partial {
			return k
		}
	}
	return -1
}

// limitsOf reads a whole environment held in memory (tests, fixtures).
func limitsOf(environ []byte) startLimits {
	var s envScanner
	l, _ := s.scan(bytes.NewReader(environ), int64(len(environ)))
	return l
}

// deviceZeroMemory is device 0's size in a pinned memory limit,
// "<device>=<size>[,...]" with sizes such as "20480M" or "20G" (binary
// units, as MPS reads them); nil where MPS could not read it, which
// limits nothing.
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
