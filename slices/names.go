package slices

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// maxLabel is the length limit of a DNS label (device and counter names).
const maxLabel = 63

// label turns free text ("0000:3b:00.0", "1g.10gb+me", "NVIDIA H100-10C")
// into a DNS label fragment: lower case, runs of other characters become one
// dash, no dash at either end. A "+" becomes the word "plus": NVIDIA names
// MIG profile variants by it, and Blackwell lists "1g.23gb+me" (with the
// media engines) beside "1g.23gb-me" (without), which would both read
// "1g-23gb-me" otherwise.
func label(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(strings.ReplaceAll(s, "+", "-plus-")) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			continue
		}
		dash = true
	}
	return b.String()
}

// join builds a DNS label from fragments. Names longer than a label keep
// their start and end a short hash of the whole, so they stay unique and
// stable.
func join(parts ...string) string {
	name := strings.Join(parts, "-")
	if len(name) <= maxLabel {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(name[:maxLabel-len(suffix)-1], "-") + "-" + suffix
}
