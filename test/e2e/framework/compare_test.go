// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"reflect"
	"testing"
)

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		want, got any
		diff      []string
	}{
		{"equal", map[string]any{"a": "x"}, map[string]any{"a": "x"}, nil},
		{"server default is fine", map[string]any{"a": "x"}, map[string]any{"a": "x", "b": 1.0}, nil},
		{"dropped field", map[string]any{"a": "x", "c": true}, map[string]any{"a": "x"}, []string{"c: dropped"}},
		{"empty field may vanish", map[string]any{"a": []any{}}, map[string]any{}, nil},
		{"changed value", map[string]any{"a": "x"}, map[string]any{"a": "y"}, []string{`a: want "x", got y`}},
		{"quantities by value", map[string]any{"q": "1024Mi"}, map[string]any{"q": "1Gi"}, nil},
		{"numbers across decoders", map[string]any{"n": int64(3)}, map[string]any{"n": 3.0}, nil},
		{"nested list", map[string]any{"l": []any{map[string]any{"k": "v"}}}, map[string]any{"l": []any{map[string]any{}}}, []string{"l[0].k: dropped"}},
		{"list length", map[string]any{"l": []any{"a", "b"}}, map[string]any{"l": []any{"a"}}, []string{"l: want 2 items, got 1 items"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Missing(tc.want, tc.got); !reflect.DeepEqual(got, tc.diff) {
				t.Errorf("Missing = %q, want %q", got, tc.diff)
			}
		})
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:          "/a/b",
		`/a\040b`:       "/a b",
		`/a\134b`:       `/a\b`,
		`/trailing\04`:  `/trailing\04`,
		`/x\040\011end`: "/x \tend",
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
