package lab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/hwdra/hwdra/api"
)

// readClaims reads ResourceClaims and ResourceClaimTemplates (a template
// stands for the claim it would make) from YAML or JSON files, and from
// the .yaml, .yml and .json files of directories (not their
// subdirectories), as kubectl -f does; applies the defaults the API server
// would and validates them as it would.
func readClaims(paths []string) ([]*resourceapi.ResourceClaim, error) {
	if len(paths) == 0 {
		return nil, errors.New("no --claim given")
	}
	files, err := expand(paths)
	if err != nil {
		return nil, err
	}
	var claims []*resourceapi.ResourceClaim
	seen := map[string]string{}
	for _, file := range files {
		docs, err := readDocuments(file)
		if err != nil {
			return nil, err
		}
		for i, doc := range docs {
			claim, err := toClaim(doc)
			if err == nil {
				err = validate(claim)
			}
			if err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", file, i+1, err)
			}
			if prev, dup := seen[claim.Name]; dup {
				return nil, fmt.Errorf("%s: claim %q already read from %s", file, claim.Name, prev)
			}
			seen[claim.Name] = file
			claims = append(claims, claim)
		}
	}
	return claims, nil
}

// expand replaces each directory by its manifest files, in name order.
func expand(paths []string) ([]string, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		n := len(files)
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
		if len(files) == n {
			return nil, fmt.Errorf("%s: no .yaml, .yml or .json file in the directory", p)
		}
	}
	return files, nil
}

func readDocuments(file string) ([]json.RawMessage, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var docs []json.RawMessage
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); err == io.EOF {
			return docs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 && string(doc) != "null" {
			docs = append(docs, doc)
		}
	}
}

// toClaim decodes one document strictly.
func toClaim(doc json.RawMessage) (*resourceapi.ResourceClaim, error) {
	var head map[string]any
	if err := json.Unmarshal(doc, &head); err != nil {
		return nil, errors.New("must be an object with apiVersion and kind")
	}
	value := func(key string) string { // as written; "" where missing
		if v, ok := head[key]; ok && v != nil {
			return fmt.Sprint(v)
		}
		return ""
	}
	if v := value("apiVersion"); v != resourceapi.SchemeGroupVersion.String() {
		return nil, fmt.Errorf("apiVersion %q: want %s", v, resourceapi.SchemeGroupVersion)
	}
	claim := &resourceapi.ResourceClaim{}
	switch value("kind") {
	case "ResourceClaim":
		if err := api.Unmarshal(doc, claim); err != nil {
			return nil, err
		}
	case "ResourceClaimTemplate":
		var t resourceapi.ResourceClaimTemplate
		if err := api.Unmarshal(doc, &t); err != nil {
			return nil, err
		}
		claim.ObjectMeta = t.ObjectMeta
		claim.Spec = t.Spec.Spec
	default:
		return nil, fmt.Errorf("kind %q: want ResourceClaim or ResourceClaimTemplate", value("kind"))
	}
	if claim.Name == "" {
		return nil, errors.New("metadata.name is required")
	}
	if claim.Namespace == "" {
		claim.Namespace = "default"
	}
	claim.UID = types.UID("lab-" + claim.Namespace + "-" + claim.Name)
	setDefaults(&claim.Spec)
	return claim, nil
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
