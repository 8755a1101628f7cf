// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/deploy"
)

// FuzzReadClaims: whatever a --claim file holds, the lab reads it as the
// API server would or says why not: never a panic; every error names the
// file it came from (here standard input) or says there was nothing to
// allocate, in the manifests' terms; every claim it takes has a name and
// a namespace, a UID, and, read from the files, passes validation again
// (what it defaulted stays valid).
func FuzzReadClaims(f *testing.F) {
	for _, glob := range []string{"../../../deploy/examples/*.yaml", "../../../docs/examples/*.yaml", "../convert/testdata/*.yaml"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			f.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		groups, _, _, err := readClaims([]string{stdinPath}, bytes.NewReader(data), classes)
		if err != nil {
			msg := err.Error()
			errs := []error{err}
			if joined, ok := err.(interface{ Unwrap() []error }); ok {
				errs = joined.Unwrap()
			}
			for _, e := range errs {
				first, _, _ := strings.Cut(e.Error(), "\n")
				if !strings.Contains(first, "(stdin)") && !strings.HasPrefix(first, "nothing to allocate") {
					t.Fatalf("an error that names no file: %q", e)
				}
			}
			for _, leak := range []string{"Go struct field", "Go value of type", "%!", "interface {}"} {
				if strings.Contains(msg, leak) && !bytes.Contains(data, []byte(leak)) {
					t.Fatalf("the error %q says %q: not in the manifests' terms", msg, leak)
				}
			}
			return
		}
		for _, g := range groups {
			for _, c := range g.claims {
				if c.Name == "" || c.Namespace == "" || c.UID == "" {
					t.Fatalf("a claim without name, namespace or UID: %+v", c.ObjectMeta)
				}
				if len(c.OwnerReferences) > 0 {
					continue // made for a pod of the files, as the resourceclaim controller does: not validated as created
				}
				if err := validate(c, nil); err != nil {
					t.Fatalf("claim %s/%s no longer valid: %v", c.Namespace, c.Name, err)
				}
			}
		}
	})
}
