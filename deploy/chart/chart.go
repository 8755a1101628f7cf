// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package chart renders the Helm chart (deploy/helm/hwdra, embedded in
// package deploy) in process with Helm's own library, the steps `helm
// template` takes: values files merged as -f merges them over the
// chart's values, checked against values.schema.json, the chart's
// kubeVersion checked, the templates rendered. The templates stay the one
// source of the DeviceClasses: `hwdra lab --values` allocates with the
// classes a cluster installed with those values has.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader/archive"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/deploy"
)

// As hack/render-deploy.sh renders deploy/hwdra.yaml.
const (
	releaseName = "hwdra"
	namespace   = "hwdra-system"
	kubeVersion = "v1.37.0"
)

// DeviceClasses renders the chart with the values files (YAML, later ones
// over earlier ones, as helm's -f takes them) and returns its
// DeviceClasses. Values the chart refuses (its schema or a template's
// check) are an error that names the value, and no class is returned.
func DeviceClasses(valuesFiles []string) ([]*resourceapi.DeviceClass, error) {
	rendered, err := Render(valuesFiles)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []*resourceapi.DeviceClass
	for _, name := range names {
		classes, err := deploy.DecodeDeviceClasses(strings.NewReader(rendered[name]), name)
		if err != nil {
			return nil, err
		}
		out = append(out, classes...)
	}
	return out, nil
}

// Render renders the chart's templates with the values files: each
// template's path (hwdra/templates/...) to its text, NOTES.txt left out.
func Render(valuesFiles []string) (map[string]string, error) {
	ch, err := load()
	if err != nil {
		return nil, err
	}
	vals, err := readValues(valuesFiles)
	if err != nil {
		return nil, err
	}
	kube, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kube.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c, kube.Version)
	}
	caps := *common.DefaultCapabilities
	caps.KubeVersion = *kube
	top, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true, Revision: 1}, &caps)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", describe(valuesFiles), err)
	}
	out, err := engine.Render(ch, top)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", describe(valuesFiles), err)
	}
	for name := range out {
		if path.Base(name) == "NOTES.txt" {
			delete(out, name)
		}
	}
	return out, nil
}

func describe(valuesFiles []string) string {
	if len(valuesFiles) == 0 {
		return "the chart with its default values"
	}
	return "the chart with values " + strings.Join(valuesFiles, ", ")
}

// load reads the embedded chart as helm's loader reads a chart's files.
func load() (*chartv2.Chart, error) {
	fsys := deploy.Chart()
	var files []*archive.BufferedFile
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, name)
		files = append(files, &archive.BufferedFile{Name: name, Data: data})
		return err
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(files)
}

// readValues merges the values files as helm's -f does (pkg/cli/values
// MergeValues): each file's documents in order, each file over those
// before it.
func readValues(valuesFiles []string) (map[string]any, error) {
	vals := map[string]any{}
	var errs []error
	for _, file := range valuesFiles {
		data, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		v, err := loader.LoadValues(bytes.NewReader(data))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", file, err))
			continue
		}
		vals = loader.MergeMaps(vals, v)
	}
	return vals, errors.Join(errs...)
}
