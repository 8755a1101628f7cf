// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A type's own UnmarshalJSON (resource.Quantity's) returns an error that
// names no field, and the JSON decoder passes it on as it is:
// "quantities must match the regular expression ...", for a tenant's
// claim with no word of where. refusedValue finds the value: it walks the
// document beside the Go type it decodes into and hands each value of a
// type with its own UnmarshalJSON to that method alone.

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// refusedValue is the field error of the first value of the document
// that its type's UnmarshalJSON refuses; nil where none does.
func refusedValue(js []byte, target reflect.Type) *field.Error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil //nolint:nilerr // no JSON to walk: the decoder's own error stands
	}
	return refusedAt(nil, doc, target, true)
}

func refusedAt(path *field.Path, v any, t reflect.Type, root bool) *field.Error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if !root && reflect.PointerTo(t).Implements(unmarshalerType) {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil //nolint:nilerr // a value read from JSON always marshals
		}
		if err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(raw); err != nil {
			return field.Invalid(path, v, err.Error())
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for key, value := range obj {
			if ft, found := jsonField(t, key); found {
				if err := refusedAt(child(path, key), value, ft, false); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		list, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, value := range list {
			if err := refusedAt(path.Index(i), value, t.Elem(), false); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for key, value := range obj {
			if err := refusedAt(path.Key(key), value, t.Elem(), false); err != nil {
				return err
			}
		}
	}
	return nil
}

func child(path *field.Path, name string) *field.Path {
	if path == nil {
		return field.NewPath(name)
	}
	return path.Child(name)
}

// jsonField is the type of the struct field that a JSON key decodes into,
// inline (embedded) structs included.
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" && f.Anonymous || strings.Contains(","+opts+",", ",inline,") {
			if ft := f.Type; ft.Kind() == reflect.Struct {
				if found, ok := jsonField(ft, key); ok {
					return found, true
				}
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f.Type, true
		}
	}
	return nil, false
}
