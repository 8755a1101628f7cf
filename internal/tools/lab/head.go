// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// docHead is what the lab reads of any document before its kind is
// known: apiVersion, kind, the name for messages, a List's items.
type docHead struct {
	APIVersion, Kind string
	Metadata         struct{ Name, Namespace, GenerateName string }
	Items            json.RawMessage
}

// readHead reads a document's head field by field, so that what is
// wrong is said in the manifest's terms ("metadata.name must be a
// string"), not in the JSON decoder's (which names Go types).
func readHead(doc json.RawMessage) (docHead, error) {
	var h docHead
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return h, fmt.Errorf("not an object with apiVersion, kind and metadata, but %s", jsonKind(doc))
	}
	var meta map[string]json.RawMessage
	if raw, ok := top["metadata"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return h, fmt.Errorf("metadata must be an object, not %s", jsonKind(raw))
		}
	}
	for _, f := range []struct {
		from  map[string]json.RawMessage
		key   string
		path  string
		value *string
	}{
		{top, "apiVersion", "apiVersion", &h.APIVersion}, {top, "kind", "kind", &h.Kind},
		{meta, "name", "metadata.name", &h.Metadata.Name}, {meta, "namespace", "metadata.namespace", &h.Metadata.Namespace},
		{meta, "generateName", "metadata.generateName", &h.Metadata.GenerateName},
	} {
		raw, ok := f.from[f.key]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.value); err != nil {
			return h, fmt.Errorf("%s must be a string, not %s", f.path, jsonKind(raw))
		}
	}
	h.Items = top["items"]
	return h, nil
}

// jsonKind says what a JSON value is, for messages.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}
