// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package api holds hwdra's versioned API types and decodes them: the
// opaque device configuration of its drivers (gpu.hwdra.io GpuConfig,
// sriov.hwdra.io VfConfig: DeviceClass and ResourceClaim
// config.opaque.parameters) and the agent's configuration file
// (config.hwdra.io AgentConfig). Every type is decoded the same way:
// strictly, by apimachinery's serializer, then defaulted and validated,
// and every error names the field in the document's terms.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
)

// Object is a decoded API object. Default fills in what the document
// leaves out; Validate checks the defaulted object.
type Object interface {
	runtime.Object
	Default()
	Validate() field.ErrorList
}

var (
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{configv1alpha1.AddToScheme, gpuv1alpha1.AddToScheme, sriovv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	// Strict: unknown and duplicate fields are errors, not silently lost.
	decoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// Decode decodes one object from YAML or JSON, strictly, then defaults
// and validates it. Errors name the field ("nics[1].bandwidth.step") and
// say what is wrong with it; several are reported together.
func Decode(data []byte) (Object, error) {
	o, err := decodeAsWritten(data)
	if err != nil {
		return nil, err
	}
	o.Default()
	return o, nil
}

// decodeAsWritten is Decode without the defaults: the object holds what
// the document sets (a defaulted copy was validated).
func decodeAsWritten(data []byte) (Object, error) {
	js, err := toJSON(data)
	if err != nil {
		return nil, err
	}
	if err := checkKind(js); err != nil {
		return nil, err
	}
	obj, gvk, err := decoder.Decode(js, nil, nil)
	_, strictOnly := runtime.AsStrictDecodingError(err)
	if err != nil && (!strictOnly || obj == nil) {
		var target reflect.Type
		if gvk != nil {
			if typed, err := scheme.New(*gvk); err == nil {
				target = reflect.TypeOf(typed)
			}
		}
		return nil, decodeError(js, err, target)
	}
	o, ok := obj.(Object)
	if !ok {
		return nil, fmt.Errorf("%s is not a configuration type", obj.GetObjectKind().GroupVersionKind().Kind)
	}
	// Unknown or duplicate fields leave the rest decoded: its problems
	// are said with theirs, every one at once.
	var errs []error
	if err != nil {
		errs = append(errs, decodeError(js, err, reflect.TypeOf(obj)))
	}
	defaulted, ok := o.DeepCopyObject().(Object)
	if !ok {
		return nil, fmt.Errorf("%s: its copy is not a configuration type", obj.GetObjectKind().GroupVersionKind().Kind)
	}
	defaulted.Default()
	if invalid := defaulted.Validate(); len(invalid) > 0 {
		errs = append(errs, invalid.ToAggregate().Errors()...)
	}
	if len(errs) > 0 {
		return nil, utilerrors.Flatten(utilerrors.NewAggregate(errs))
	}
	return o, nil
}

// Unmarshal decodes a YAML or JSON document that is not an API object
// (no apiVersion and kind) into out with the same strictness and the same
// errors as Decode.
func Unmarshal(data []byte, out any) error {
	js, err := toJSON(data)
	if err != nil {
		return err
	}
	if string(js) == "null" {
		return errors.New("empty document")
	}
	strict, err := sigsjson.UnmarshalStrict(js, out, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return decodeError(js, err, reflect.TypeOf(out))
	}
	return utilerrors.NewAggregate(strict)
}

// toJSON converts YAML (JSON is YAML) to JSON, refusing duplicate keys;
// its errors give the line.
func toJSON(data []byte) ([]byte, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		if strings.HasPrefix(msg, "unsupported map key of type") || strings.HasPrefix(msg, "yaml: invalid map key") {
			// The messages of sigs.k8s.io/yaml and go-yaml for a null,
			// list or map key print Go types ("%!s(<nil>)",
			// "[]interface {}") and values.
			return nil, errors.New("a key is null, a list or an object: keys must be strings")
		}
		// "yaml: unmarshal errors:\n  line 4: key "nics" already set in map\n  line 7: ..."
		if lines := strings.Split(msg, "\n"); len(lines) > 1 && lines[0] == "yaml: unmarshal errors:" {
			for i := range lines {
				lines[i] = strings.TrimSpace(lines[i])
			}
			msg = strings.Join(lines[1:], ", ")
		}
		return nil, errors.New(msg)
	}
	return js, nil
}

// checkKind checks that the document is an object whose apiVersion and
// kind name a type of the scheme, and says which ones exist where not.
func checkKind(js []byte) error {
	var head map[string]any
	if err := json.Unmarshal(js, &head); err != nil {
		return errors.New("must be an object with apiVersion and kind")
	}
	if head == nil {
		return errors.New("empty document")
	}
	var errs field.ErrorList
	str := func(name string) string {
		v, ok := head[name]
		if !ok {
			errs = append(errs, field.Required(field.NewPath(name), ""))
			return ""
		}
		s, ok := v.(string)
		if !ok {
			errs = append(errs, field.Invalid(field.NewPath(name), v, "must be a string"))
		}
		return s
	}
	apiVersion, kind := str("apiVersion"), str("kind")
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return field.Invalid(field.NewPath("apiVersion"), apiVersion, "must be group/version")
	}
	if scheme.Recognizes(gv.WithKind(kind)) {
		return nil
	}
	if gv.Group == nvidiaConfigGroup {
		return field.Invalid(field.NewPath("apiVersion"), apiVersion, kind+" is "+convertHint)
	}
	var versions []string
	for _, known := range scheme.PrioritizedVersionsAllGroups() {
		if known.Group == gv.Group || !scheme.IsGroupRegistered(gv.Group) {
			versions = append(versions, known.String())
		}
	}
	if !scheme.IsVersionRegistered(gv) {
		slices.Sort(versions)
		return field.NotSupported(field.NewPath("apiVersion"), apiVersion, versions)
	}
	var kinds []string
	for k := range scheme.KnownTypes(gv) {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	return field.NotSupported(field.NewPath("kind"), kind, kinds)
}

// decodeError restates the JSON decoder's errors in the document's
// terms: its unknown and duplicate fields come with their paths
// already ("unknown field \"nics[1].bandwidth.stp\""); a wrong type
// names a Go type and a path without list indices, so it is found again
// in the document by its offset; a value a type refused in its own
// UnmarshalJSON (a resource.Quantity) is found by decoding the document's
// values of such types one by one into target.
func decodeError(js []byte, err error, target reflect.Type) error {
	if strict, ok := runtime.AsStrictDecodingError(err); ok {
		return utilerrors.NewAggregate(strict.Errors())
	}
	if target != nil {
		if ferr := refusedValue(js, target); ferr != nil {
			return ferr
		}
	}
	if offset, want, ok := typeError(err); ok {
		if path, value, found := valueAt(js, offset); found {
			for want.Kind() == reflect.Pointer {
				want = want.Elem()
			}
			detail := "must be " + describe(want)
			if _, isNumber := value.(json.Number); isNumber && want.Kind() == reflect.String {
				detail += " (quote it)"
			}
			if path == nil {
				return errors.New("the document " + detail)
			}
			if d, ok := value.(json.Delim); ok {
				return field.TypeInvalid(path, field.OmitValueType{}, detail+", not "+map[json.Delim]string{'[': "a list", '{': "an object"}[d])
			}
			return field.TypeInvalid(path, value, detail)
		}
	}
	return err
}

// typeError reads the offset and the wanted Go type of the JSON
// decoder's type error (sigs.k8s.io/json's UnmarshalTypeError, an
// internal type of that module: read by its field names).
func typeError(err error) (offset int64, want reflect.Type, ok bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "UnmarshalTypeError" {
		return 0, nil, false
	}
	o, t := v.Elem().FieldByName("Offset"), v.Elem().FieldByName("Type")
	if !o.IsValid() || o.Kind() != reflect.Int64 || !t.IsValid() || !t.CanInterface() {
		return 0, nil, false
	}
	want, ok = t.Interface().(reflect.Type)
	return o.Int(), want, ok && want != nil
}

// describe says what a JSON value for a Go type must be.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "of another type"
}

// valueAt finds the value of a JSON document that the decoder's offset
// points at: the first whose opening token (a scalar, or "[" or "{")
// ends at or after it. It returns the value's path and the scalar, or the
// json.Delim of a list or object (a nil path: the document itself).
func valueAt(js []byte, offset int64) (path *field.Path, value any, found bool) {
	var stack []*jsonLevel
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		var top *jsonLevel
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch d, _ := tok.(json.Delim); {
		case d == '}' || d == ']':
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				stack[len(stack)-1].valueDone()
			}
			continue
		case top != nil && top.object && !top.haveKey:
			top.key, top.haveKey = tok.(string), true
			continue
		}
		path := top.valuePath()
		if dec.InputOffset() >= offset {
			return path, tok, true
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, &jsonLevel{path: path, object: d == '{'})
		} else if top != nil {
			top.valueDone()
		}
	}
}

// jsonLevel is an object or list valueAt is in.
type jsonLevel struct {
	path    *field.Path
	object  bool
	key     string // an object's current key, if haveKey
	haveKey bool
	index   int // a list's current index
}

// valuePath is the path of the value read next in l (nil: the document).
func (l *jsonLevel) valuePath() *field.Path {
	switch {
	case l == nil:
		return nil
	case !l.object:
		return l.path.Index(l.index)
	case l.path == nil:
		return field.NewPath(l.key)
	}
	return l.path.Child(l.key)
}

func (l *jsonLevel) valueDone() {
	if l.object {
		l.haveKey = false
	} else {
		l.index++
	}
}
