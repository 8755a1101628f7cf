// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Missing lists every field of want that got lacks or holds differently, as
// paths ("spec.devices[3].attributes.gpu.hwdra.io/profile.string"). Fields
// only in got (server defaults) are fine. Quantities compare by value, so
// "1024Mi" and "1Gi" agree. An empty result means nothing was dropped.
func Missing(want, got any) []string {
	var out []string
	missing("", want, got, &out)
	sort.Strings(out)
	return out
}

func missing(path string, want, got any, out *[]string) {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: want an object, got %T", path, got))
			return
		}
		for k, wv := range w {
			gv, ok := g[k]
			p := join(path, k)
			if !ok {
				if !isEmpty(wv) {
					*out = append(*out, p+": dropped")
				}
				continue
			}
			missing(p, wv, gv, out)
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			*out = append(*out, fmt.Sprintf("%s: want %d items, got %v", path, len(w), describeLen(got)))
			return
		}
		for i := range w {
			missing(fmt.Sprintf("%s[%d]", path, i), w[i], g[i], out)
		}
	case string:
		if gs, ok := got.(string); ok && gs != w {
			if wq, err1 := resource.ParseQuantity(w); err1 == nil {
				if gq, err2 := resource.ParseQuantity(gs); err2 == nil && wq.Cmp(gq) == 0 {
					return
				}
			}
		}
		if !reflect.DeepEqual(want, got) {
			*out = append(*out, fmt.Sprintf("%s: want %q, got %v", path, w, got))
		}
	default:
		if !reflect.DeepEqual(normalizeNumber(want), normalizeNumber(got)) {
			*out = append(*out, fmt.Sprintf("%s: want %v, got %v", path, want, got))
		}
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func describeLen(v any) string {
	if l, ok := v.([]any); ok {
		return fmt.Sprintf("%d items", len(l))
	}
	return fmt.Sprintf("%T", v)
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

// normalizeNumber makes JSON numbers from different decoders comparable.
func normalizeNumber(v any) any {
	switch x := v.(type) {
	case int:
		return float64(x)
	case int32:
		return float64(x)
	case int64:
		return float64(x)
	case float32:
		return float64(x)
	}
	return v
}

// RecordTiming logs a duration in a fixed, greppable form
// ("hwdra e2e timing: <what>: <duration>") for the suite's report.
func RecordTiming(t testing.TB, what string, d time.Duration) {
	t.Helper()
	line := fmt.Sprintf("hwdra e2e timing: %s: %v", what, d.Round(time.Millisecond))
	t.Log(line)
	fmt.Fprintln(os.Stderr, line)
}
