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

	"k8s.io/apiserver/pkg/storage/names"

	"github.com/hwdra/hwdra/api"
)

// claimFile is the claims of one --claim file (or of stdin): allocated
// together, as one pod's claims are.
type claimFile struct {
	path   string
	claims []*resourceapi.ResourceClaim
}

// stdinPath is the --claim that reads standard input, as kubectl -f -.
const stdinPath = "-"

// readClaims reads ResourceClaims and ResourceClaimTemplates (a template
// stands for the claim it would make) from YAML or JSON files, from the
// .yaml, .yml and .json files of directories (not their subdirectories),
// and from stdin for "-", as kubectl -f does; applies the defaults the API
// server would and validates them as it would. Every problem of every file
// is reported, and any problem means no claims.
func readClaims(paths []string, stdin io.Reader) ([]claimFile, error) {
	if len(paths) == 0 {
		return nil, errors.New("no --claim given")
	}
	files, err := expand(paths)
	if err != nil {
		return nil, err
	}
	var (
		out  []claimFile
		errs []error
		seen = map[string]string{}
	)
	for _, file := range files {
		docs, err := readDocuments(file, stdin)
		if err == nil && len(docs) == 0 {
			err = fmt.Errorf("%s: no ResourceClaim or ResourceClaimTemplate in it", displayName(file))
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f := claimFile{path: displayName(file)}
		for i, doc := range docs {
			claim, err := toClaim(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s, document %d: %w", f.path, i+1, err))
				continue
			}
			key := claim.Namespace + "/" + claim.Name
			if prev, dup := seen[key]; dup {
				errs = append(errs, fmt.Errorf("%s, document %d: claim %s already read from %s", f.path, i+1, key, prev))
				continue
			}
			seen[key] = f.path
			f.claims = append(f.claims, claim)
		}
		out = append(out, f)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func displayName(file string) string {
	if file == stdinPath {
		return "(stdin)"
	}
	return file
}

// expand replaces each directory by its manifest files, in name order.
func expand(paths []string) ([]string, error) {
	var files []string
	stdin := false
	for _, p := range paths {
		if p == stdinPath {
			if stdin {
				return nil, errors.New("--claim -: standard input given twice")
			}
			stdin = true
			files = append(files, p)
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("--claim: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("--claim: %w", err)
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
	var template *resourceapi.ResourceClaimTemplate
	switch kind := value("kind"); kind {
	case "ResourceClaim":
		if err := api.Unmarshal(doc, claim); err != nil {
			return nil, err
		}
	case "ResourceClaimTemplate":
		template = &resourceapi.ResourceClaimTemplate{}
		if err := api.Unmarshal(doc, template); err != nil {
			return nil, err
		}
		claim.ObjectMeta = template.ObjectMeta
		claim.Spec = template.Spec.Spec
	default:
		return nil, fmt.Errorf("kind %q: want ResourceClaim or ResourceClaimTemplate", kind)
	}
	// As the API server: a generated name, the namespace kubectl uses.
	if claim.Name == "" && claim.GenerateName != "" {
		claim.Name = names.SimpleNameGenerator.GenerateName(claim.GenerateName)
	}
	if claim.Namespace == "" {
		claim.Namespace = "default"
	}
	setDefaults(&claim.Spec)
	if err := validate(claim, template); err != nil {
		return nil, err
	}
	claim.UID = types.UID("lab-" + claim.Namespace + "-" + claim.Name)
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
