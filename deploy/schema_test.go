// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
)

// schemaNode is the part of a JSON schema the chart's uses.
type schemaNode struct {
	Properties           map[string]*schemaNode `json:"properties"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Items                *schemaNode            `json:"items"`
	Ref                  string                 `json:"$ref"`
	Definitions          map[string]*schemaNode `json:"definitions"`
}

const chart = "helm/hwdra"

func loadSchema(t *testing.T) *schemaNode {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaNode
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return &s
}

// closed: the node lists its properties and refuses others.
func (n *schemaNode) closed() bool { return n.Properties != nil && n.AdditionalProperties == false }

// TestValuesSchemaMatchesValues: helm refuses values the schema does not
// name, so every value of values.yaml and of the test values is in it,
// and the schema names no value values.yaml does not document.
func TestValuesSchemaMatchesValues(t *testing.T) {
	schema := loadSchema(t)
	files, _ := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	for _, file := range append([]string{filepath.Join(chart, "values.yaml")}, files...) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var values map[string]any
		if err := yaml.Unmarshal(data, &values); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		checkValues(t, file, "", schema, values)
		if strings.HasSuffix(file, "/values.yaml") {
			for name := range schema.Properties {
				if _, ok := values[name]; !ok {
					t.Errorf("values.schema.json names %s, values.yaml does not document it", name)
				}
			}
		}
	}
}

func checkValues(t *testing.T, file, path string, s *schemaNode, v any) {
	if list, ok := v.([]any); ok && s.Items != nil {
		for _, el := range list {
			checkValues(t, file, path+"[]", s.Items, el)
		}
		return
	}
	m, ok := v.(map[string]any)
	if !ok || !s.closed() {
		return
	}
	for k, val := range m {
		p := strings.TrimPrefix(path+"."+k, ".")
		child, ok := s.Properties[k]
		if !ok {
			t.Errorf("%s: %s is not in values.schema.json: helm would refuse it", file, p)
			continue
		}
		checkValues(t, file, p, child, val)
	}
}

// TestValuesSchemaConfigIsAgentConfig: the schema's config section has
// exactly the AgentConfig's fields, at every level, so that a field added
// to the type is also taken by the chart.
func TestValuesSchemaConfigIsAgentConfig(t *testing.T) {
	schema := loadSchema(t)
	checkType(t, schema, "config", schema.Properties["config"], reflect.TypeFor[configv1alpha1.AgentConfig]())
}

func checkType(t *testing.T, root *schemaNode, path string, s *schemaNode, typ reflect.Type) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if s == nil {
		t.Errorf("values.schema.json has no %s", path)
		return
	}
	if s.Ref != "" {
		s = root.Definitions[strings.TrimPrefix(s.Ref, "#/definitions/")]
	}
	switch typ.Kind() {
	case reflect.Slice:
		checkType(t, root, path+"[]", s.Items, typ.Elem())
	case reflect.Struct:
		if !s.closed() {
			t.Errorf("values.schema.json: %s takes any property, the type only its fields", path)
		}
		var fields []string
		for _, f := range jsonFields(typ) {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, name)
			checkType(t, root, path+"."+name, s.Properties[name], f.Type)
		}
		for name := range s.Properties {
			if !slices.Contains(fields, name) {
				t.Errorf("values.schema.json: %s.%s is no field of %s", path, name, typ.Name())
			}
		}
	}
}

// jsonFields are the fields of a struct as JSON has them: those of an
// embedded struct (inline) in its place, but not TypeMeta's (the chart
// writes apiVersion and kind).
func jsonFields(typ reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case f.Anonymous && f.Type == reflect.TypeFor[metav1.TypeMeta]():
		case f.Anonymous:
			out = append(out, jsonFields(f.Type)...)
		case name != "" && name != "-":
			out = append(out, f)
		}
	}
	return out
}
