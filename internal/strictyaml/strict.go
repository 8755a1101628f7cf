// Package strictyaml decodes YAML configuration files strictly, naming the
// path of every unknown field and wrong type. Its last user is the mock
// hardware profile (hw/mock); everything else decodes with api.Decode or
// api.Unmarshal, which the profile is to use too, and then this package
// goes.
package strictyaml

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Decode decodes YAML into out (a pointer to a struct) and refuses
// duplicate keys, unknown fields and wrong types, naming the path of each
// ("nics[1].bandwidth.stp: unknown field"). encoding/json alone names
// neither the path of an unknown field nor matches keys case-sensitively.
func Decode(data []byte, out any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	var generic any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		return err
	}
	if generic == nil {
		return fmt.Errorf("empty file")
	}
	var problems []string
	check(reflect.TypeOf(out).Elem(), generic, "", &problems)
	if len(problems) > 0 {
		sort.Strings(problems) // map order is random
		return Problems(problems)
	}
	return json.Unmarshal(js, out)
}

// Problems are field errors, one per line.
type Problems []string

func (e Problems) Error() string { return strings.Join(e, "\n") }

// check walks a decoded JSON value along the Go type it will decode into.
func check(t reflect.Type, v any, path string, problems *[]string) {
	if v == nil {
		return // null: the field stays at its zero value
	}
	bad := func(want string) {
		*problems = append(*problems, fmt.Sprintf("%s: must be %s", orRoot(path), want))
	}
	switch t.Kind() {
	case reflect.Pointer:
		check(t.Elem(), v, path, problems)
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			bad("an object")
			return
		}
		fields := jsonFields(t)
		for key, val := range obj {
			p := join(path, key)
			f, ok := fields[key]
			if !ok {
				*problems = append(*problems, fmt.Sprintf("%s: unknown field", p))
				continue
			}
			check(f.Type, val, p, problems)
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			bad("a list")
			return
		}
		for i, el := range arr {
			check(t.Elem(), el, fmt.Sprintf("%s[%d]", path, i), problems)
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			bad("a string (quote it)")
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			bad("true or false")
		}
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			bad("an integer")
		}
	}
}

// jsonFields maps the exported fields of a struct by their JSON names.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	fields := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f
	}
	return fields
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "(file)"
	}
	return path
}
