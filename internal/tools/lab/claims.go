// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/storage/names"

	"github.com/hwdra/hwdra/internal/tools/manifestfiles"
)

// claimGroup is claims allocated together, as one pod's are: a pod's
// (named by the claims it names, the claims made from the templates it
// names and the claim of its extended resources), or those of one --claim
// file (or of stdin) that no pod names.
type claimGroup struct {
	name   string // the file, or "file, document 3: Pod ns/name"
	claims []*resourceapi.ResourceClaim
}

// stdinPath is the --claim that reads standard input, as kubectl -f -.
const stdinPath = manifestfiles.Stdin

// readClaims reads YAML or JSON files, from the .yaml, .yml and .json
// files of directories (not their subdirectories), and from stdin for
// "-", as kubectl -f does, each of one or more documents, and Lists. It
// takes ResourceClaims and ResourceClaimTemplates (v1, and v1beta1 and
// v1beta2 converted to v1), Pods and the pods of workloads
// (manifests.go), resolves what the pods ask for (pods.go) with the
// given DeviceClasses, applies the defaults the API server would and
// validates the claims as it would. It returns the groups to allocate in
// order and a line for each thing worth saying: what it skipped and why,
// what each pod gets. The files' DeviceClasses join the given ones (one
// of the same name replaced): the classes to allocate with. Every problem
// of every file is reported, and any problem means no claims.
func readClaims(paths []string, stdin io.Reader, classes []*resourceapi.DeviceClass) ([]claimGroup, []*resourceapi.DeviceClass, []string, error) {
	if len(paths) == 0 {
		return nil, nil, nil, errors.New("no --claim given")
	}
	files, err := manifestfiles.Expand(paths)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--claim: %w", err)
	}
	all, fileClasses, seen, errs := readFiles(files, stdin)
	var notes []string
	classes, classNotes, err := mergeClasses(classes, fileClasses)
	if err != nil {
		errs = append(errs, err)
	}
	notes = append(notes, classNotes...)

	// Pods first: which claims they take; after errors above too, as
	// kubectl reports every object's.
	r := newResolver(seen, classes)
	r.incomplete = len(errs) > 0
	podGroups := make([][]claimGroup, len(all))
	for i, f := range all {
		for _, p := range f.pods {
			g, lines, err := r.pod(p)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if len(g.claims) > 0 {
				podGroups[i] = append(podGroups[i], g)
			}
			all[i].notes = append(all[i].notes, lines...)
		}
	}
	if len(errs) > 0 {
		return nil, nil, nil, errors.Join(errs...)
	}
	// Then each file: the claims no pod names, together; its pods.
	var out []claimGroup
	for i, f := range all {
		notes = append(notes, f.notes...)
		g := claimGroup{name: f.path}
		for _, c := range f.claims {
			if !c.used {
				g.claims = append(g.claims, c.claim)
			}
		}
		if len(g.claims) > 0 {
			out = append(out, g)
		}
		out = append(out, podGroups[i]...)
	}
	if len(out) == 0 {
		return nil, nil, notes, errors.New("nothing to allocate: no claim, claim template or pod that asks for devices in the files given")
	}
	return out, classes, notes, nil
}

// readFile is what one file holds: its claims, pods and notes.
type readFile struct {
	path string
	manifest
}

// readFiles reads every document of every file: the files' claims (seen:
// by kind, namespace and name, each once), pods, DeviceClasses and notes,
// and every problem of every file.
func readFiles(files []string, stdin io.Reader) (all []readFile, fileClasses []*readClass, seen map[string]*readClaim, errs []error) {
	seen = map[string]*readClaim{}
	for _, file := range files {
		docs, err := readDocuments(file, stdin)
		if err == nil && len(docs) == 0 {
			err = fmt.Errorf("%s: no ResourceClaim, ResourceClaimTemplate or pod in it", displayName(file))
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f := readFile{path: displayName(file)}
		for i, doc := range docs {
			m, err := decodeDocument(fmt.Sprintf("%s, document %d", f.path, i+1), doc)
			if err != nil {
				errs = append(errs, err)
			}
			for _, c := range m.claims {
				key := claimKey(c.template != nil, c.claim.Namespace, c.claim.Name)
				if prev, dup := seen[key]; dup {
					errs = append(errs, fmt.Errorf("%s: %s already read from %s", c.at, key, prev.at))
					continue
				}
				seen[key] = c
				f.claims = append(f.claims, c)
			}
			f.pods = append(f.pods, m.pods...)
			fileClasses = append(fileClasses, m.classes...)
			f.notes = append(f.notes, m.notes...)
		}
		all = append(all, f)
	}
	return all, fileClasses, seen, errs
}

// claimKey names a claim or a template for duplicates and lookups.
func claimKey(template bool, namespace, name string) string {
	if template {
		return "ResourceClaimTemplate " + namespace + "/" + name
	}
	return "ResourceClaim " + namespace + "/" + name
}

func displayName(file string) string {
	if file == stdinPath {
		return "(stdin)"
	}
	return file
}

// readDocuments reads the documents of a file, or of stdin for "-".
func readDocuments(file string, stdin io.Reader) ([]json.RawMessage, error) {
	r := stdin
	if file != stdinPath {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	} else if r == nil {
		return nil, errors.New("--claim -: no standard input")
	}
	file = displayName(file)
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var docs []json.RawMessage
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); err == io.EOF {
			return docs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", file, yamlError(err))
		}
		if len(bytes.TrimSpace(doc)) > 0 && string(doc) != "null" {
			docs = append(docs, doc)
		}
	}
}

// prepareClaim does to a decoded claim (or the claim a template stands
// for) what the API server does on create: a generated name, the
// namespace kubectl uses, the defaults; then validates it as it would.
func prepareClaim(claim *resourceapi.ResourceClaim, template *resourceapi.ResourceClaimTemplate) error {
	if claim.Name == "" && claim.GenerateName != "" {
		claim.Name = names.SimpleNameGenerator.GenerateName(claim.GenerateName)
	}
	if claim.Namespace == "" {
		claim.Namespace = "default"
	}
	setDefaults(&claim.Spec)
	if err := errors.Join(validate(claim, template), configErrors(claim)); err != nil {
		return err
	}
	claim.UID = claimUID(claim)
	return nil
}

func claimUID(c *resourceapi.ResourceClaim) types.UID {
	return types.UID("lab-" + c.Namespace + "-" + c.Name)
}

// setDefaults applies the API server's defaults for device requests: an
// exact count of one.
func setDefaults(spec *resourceapi.ResourceClaimSpec) {
	def := func(mode *resourceapi.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			def(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			def(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}

// yamlError restates the YAML decoders' message for a null, list or
// object key, which prints Go types ("%!s(<nil>)", "[]interface {}") and
// values (found by FuzzReadClaims).
func yamlError(err error) error {
	if msg := err.Error(); strings.Contains(msg, "unsupported map key of type") || strings.Contains(msg, "invalid map key") {
		return errors.New("a key is null, a list or an object: keys must be strings")
	}
	return err
}
