// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package convert rewrites manifests written for NVIDIA's GPU DRA driver
// (driver gpu.nvidia.com, github.com/NVIDIA/k8s-dra-driver-gpu) into
// hwdra's terms: DeviceClass names, CEL selectors (cel.go), constraint
// attributes, device taint tolerations and the opaque resource.nvidia.com
// configs (config.go), by the tables in names.go. Every document of
// another kind passes through unchanged, byte for byte; pods and the pod
// templates of workloads are read only to name what cannot work (a claim
// template of a ComputeDomain). Whatever has no equivalent is a Finding
// naming the file, the object and the field, never skipped silently; it
// stays in the output as written, except the per-device MPS limits
// (hwdra has nowhere to put them).
package convert

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/tools/claimspec"
	"github.com/hwdra/hwdra/internal/tools/manifestfiles"
)

// Input is one file's content; Name is how findings name it.
type Input struct {
	Name string
	Data []byte
}

// Finding is something convert could not map (a problem) or did in a way
// worth saying (a note).
type Finding struct {
	File, Object, Field, Why string
}

func (f Finding) String() string {
	s := f.File + ": " + f.Object
	if f.Field != "" {
		s += ": " + f.Field
	}
	return s + ": " + f.Why
}

// Result is the converted documents and what was said about them.
type Result struct {
	Output   []byte
	Problems []Finding
	Notes    []Finding
}

// Read reads files, the .yaml, .yml and .json files of directories (not
// their subdirectories) and "-" (stdin), as kubectl -f does.
func Read(paths []string, stdin io.Reader) ([]Input, error) {
	files, err := manifestfiles.Expand(paths)
	if err != nil {
		return nil, err
	}
	var out []Input
	for _, f := range files {
		var data []byte
		if f == manifestfiles.Stdin {
			if data, err = io.ReadAll(stdin); err != nil {
				return nil, fmt.Errorf("standard input: %w", err)
			}
			out = append(out, Input{Name: "<stdin>", Data: data})
			continue
		}
		if data, err = os.ReadFile(f); err != nil {
			return nil, err
		}
		out = append(out, Input{Name: f, Data: data})
	}
	return out, nil
}

// doc is one document of an input.
type doc struct {
	file  string
	index int    // 1-based, in its file
	raw   []byte // as written, written back when unchanged
	js    []byte // nil: no object (comments only)
	head  struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
}

func (d *doc) object() string {
	switch {
	case d.head.Metadata.Name == "":
		return fmt.Sprintf("document %d (%s)", d.index, d.head.Kind)
	case d.head.Metadata.Namespace == "":
		return d.head.Kind + " " + d.head.Metadata.Name
	}
	return d.head.Kind + " " + d.head.Metadata.Namespace + "/" + d.head.Metadata.Name
}

type converter struct {
	res Result
	// classes defined in the inputs: a claim may name them.
	classes map[string]bool
	// cdTemplates: namespace/name of the claim templates ComputeDomains
	// in the inputs have their controller make.
	cdTemplates map[string]bool
}

// Convert converts every document of the inputs, in order. Its error is
// for input that is not YAML at all; everything else is a Finding.
func Convert(inputs []Input) (Result, error) {
	c := &converter{classes: map[string]bool{}, cdTemplates: map[string]bool{}}
	var docs []*doc
	for _, in := range inputs {
		ds, err := split(in)
		if err != nil {
			return Result{}, err
		}
		docs = append(docs, ds...)
	}
	for _, d := range docs {
		c.learn(d)
	}
	var out [][]byte
	for _, d := range docs {
		if b := c.convert(d); b != nil {
			out = append(out, trimBlankLines(b))
		}
	}
	c.res.Output = append(bytes.Join(out, []byte("\n---\n")), '\n')
	return c.res, nil
}

// trimBlankLines drops a document's leading and trailing blank lines, but
// not the indentation of its first line: a document written back as it
// was read (one convert does not understand) must mean what it meant
// (found by FuzzConvert: " a: 0\n0" trimmed whole no longer parses).
func trimBlankLines(b []byte) []byte {
	for {
		line, rest, found := bytes.Cut(b, []byte("\n"))
		if !found || len(bytes.TrimSpace(line)) > 0 {
			break
		}
		b = rest
	}
	return bytes.TrimRight(b, " \t\r\n")
}

// split reads an input's documents; a List's items become documents of
// their own.
func split(in Input) ([]*doc, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(in.Data)))
	var out []*doc
	for i := 1; ; i++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", in.Name, err)
		}
		d := &doc{file: in.Name, index: i, raw: raw}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", in.Name, i, err)
		}
		if s := strings.TrimSpace(string(js)); s != "null" && s != "" {
			d.js = js
			if err := json.Unmarshal(js, &d.head); err != nil {
				return nil, fmt.Errorf("%s, document %d: not an object: %w", in.Name, i, err)
			}
		}
		if d.head.Kind == "List" && d.head.APIVersion == "v1" {
			var list struct{ Items []json.RawMessage }
			if err := json.Unmarshal(js, &list); err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", in.Name, i, err)
			}
			for _, item := range list.Items {
				y, _ := yaml.JSONToYAML(item)
				sub, err := split(Input{Name: in.Name, Data: y})
				if err != nil {
					return nil, err
				}
				for _, s := range sub {
					s.index = i
				}
				out = append(out, sub...)
			}
			continue
		}
		out = append(out, d)
	}
}

// learn notes what later documents may refer to.
func (c *converter) learn(d *doc) {
	gv, _ := schema.ParseGroupVersion(d.head.APIVersion)
	switch {
	case gv.Group == resourceapi.GroupName && d.head.Kind == "DeviceClass":
		c.classes[d.head.Metadata.Name] = true
	case gv.Group == nvidiaConfigGroup && d.head.Kind == "ComputeDomain":
		var cd struct {
			Spec struct {
				Channel *struct {
					ResourceClaimTemplate struct{ Name string } `json:"resourceClaimTemplate"`
				} `json:"channel"`
			} `json:"spec"`
		}
		if json.Unmarshal(d.js, &cd) == nil && cd.Spec.Channel != nil {
			c.cdTemplates[d.head.Metadata.Namespace+"/"+cd.Spec.Channel.ResourceClaimTemplate.Name] = true
		}
	}
}

func (c *converter) problem(d *doc, p *field.Path, why string) {
	c.res.Problems = append(c.res.Problems, Finding{File: d.file, Object: d.object(), Field: pathString(p), Why: why})
}

func (c *converter) note(d *doc, p *field.Path, why string) {
	c.res.Notes = append(c.res.Notes, Finding{File: d.file, Object: d.object(), Field: pathString(p), Why: why})
}

func pathString(p *field.Path) string {
	if p == nil {
		return ""
	}
	return p.String()
}

// convert returns what to write for a document: nil to leave it out.
func (c *converter) convert(d *doc) []byte {
	if d.js == nil {
		return d.raw
	}
	gv, err := schema.ParseGroupVersion(d.head.APIVersion)
	if err != nil {
		c.problem(d, field.NewPath("apiVersion"), err.Error())
		return d.raw
	}
	switch {
	case gv.Group == resourceapi.GroupName:
		return c.resource(d, gv.Version)
	case gv.Group == nvidiaConfigGroup && d.head.Kind == "ComputeDomain":
		c.problem(d, nil, computeDomainWhy)
	case strings.HasSuffix(gv.Group, nvidiaDomainSuffix):
		c.problem(d, nil, fmt.Sprintf("%s is a kind of NVIDIA's driver that hwdra has no equivalent of", gv.WithKind(d.head.Kind)))
	default:
		c.pods(d, gv)
	}
	return d.raw
}

// resource converts the resource.k8s.io kinds: v1, and v1beta2 and
// v1beta1 written as v1 (v1beta2 has v1's shape; v1beta1 has a request's
// fields where v1 has them under exactly).
func (c *converter) resource(d *doc, version string) []byte {
	kind := d.head.Kind
	if !slices.Contains([]string{"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"}, kind) {
		return d.raw
	}
	js := d.js
	switch version {
	case "v1":
	case "v1beta2", "v1beta1":
		var err error
		if js, err = toV1(js, kind, version); err != nil {
			c.problem(d, nil, err.Error())
			return d.raw
		}
	default:
		c.problem(d, field.NewPath("apiVersion"), fmt.Sprintf("%s: hwdra convert reads resource.k8s.io v1, v1beta2 and v1beta1", d.head.APIVersion))
		return d.raw
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		c.problem(d, nil, err.Error())
		return d.raw
	}
	m["apiVersion"] = resourceapi.SchemeGroupVersion.String()
	js, _ = json.Marshal(m)
	var obj any
	var devices func(*converter, *doc) bool
	switch kind {
	case "DeviceClass":
		name := d.head.Metadata.Name
		if to, ok := classes[name]; ok {
			c.note(d, nil, fmt.Sprintf(stockClassNoteWhy, to))
			return nil
		}
		if computeDomainClasses[name] {
			c.problem(d, nil, computeDomainWhy)
			return d.raw
		}
		dc := &resourceapi.DeviceClass{}
		obj = dc
		devices = func(c *converter, d *doc) bool { return c.deviceClass(d, &dc.Spec) }
	case "ResourceClaim":
		rc := &resourceapi.ResourceClaim{}
		obj = rc
		devices = func(c *converter, d *doc) bool {
			return c.deviceClaim(d, &rc.Spec.Devices, field.NewPath("spec", "devices"))
		}
	case "ResourceClaimTemplate":
		t := &resourceapi.ResourceClaimTemplate{}
		obj = t
		devices = func(c *converter, d *doc) bool {
			return c.deviceClaim(d, &t.Spec.Spec.Devices, field.NewPath("spec", "spec", "devices"))
		}
	}
	if err := yaml.UnmarshalStrict(js, obj); err != nil {
		c.problem(d, nil, fmt.Sprintf("does not decode as %s %s: %v", resourceapi.SchemeGroupVersion, kind, err))
		return d.raw
	}
	if !devices(c, d) && version == "v1" {
		return d.raw
	}
	out, err := marshal(obj)
	if err != nil {
		c.problem(d, nil, err.Error())
		return d.raw
	}
	return out
}

// toV1 converts a v1beta2 or v1beta1 object to v1 as the API server does
// (internal/claimspec, which the lab reads them with too); a DeviceClass
// has v1's shape in both.
func toV1(js []byte, kind, version string) ([]byte, error) {
	strict := func(out any) error { return yaml.UnmarshalStrict(js, out) }
	var obj any
	var err error
	tm := metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: kind}
	switch kind {
	case "ResourceClaim":
		var c *resourceapi.ResourceClaim
		c, err = claimspec.DecodeClaim(version, strict)
		c.TypeMeta, obj = tm, c
	case "ResourceClaimTemplate":
		var t *resourceapi.ResourceClaimTemplate
		t, err = claimspec.DecodeTemplate(version, strict)
		t.TypeMeta, obj = tm, t
	default:
		return js, nil
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// marshal writes an object as YAML without the empty fields the API
// types always have (creationTimestamp: null, status: {}).
func marshal(obj any) ([]byte, error) {
	js, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return nil, err
	}
	prune(m)
	return yaml.Marshal(m)
}

func prune(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			prune(x)
			if st, ok := x.(map[string]any); x == nil && k == "creationTimestamp" || ok && len(st) == 0 && (k == "status" || k == "metadata") {
				delete(v, k)
			}
		}
	case []any:
		for _, x := range v {
			prune(x)
		}
	}
}
