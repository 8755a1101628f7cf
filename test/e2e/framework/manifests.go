// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// DeployDir is the repository's deploy/ directory.
func DeployDir() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy"), nil
}

// ApplyDeploy installs the chart (deploy/helm/hwdra) as the cluster admin
// with this node's values: namespace, service account, RBAC, admission
// policy, DeviceClasses, configuration and the DaemonSet, whose pod runs
// only once the node has AgentPodLabel (StartAgentPod).
func (n *Node) ApplyDeploy(ctx context.Context) error {
	return n.InstallChart(ctx, n.AgentValues("mock:dgx-h100"))
}

// ReadObjects decodes a multi-document YAML (or JSON) stream.
func ReadObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue // an empty document
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// ApplyFile server-side applies every object of a YAML file; objects without
// a namespace that need one get namespace. It returns the applied objects as
// the server stored them.
func ApplyFile(ctx context.Context, cfg *rest.Config, path, namespace string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := ReadObjects(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out, err := Apply(ctx, cfg, namespace, objs...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Apply server-side applies objects with the given credentials (so a test
// can apply as the agent as well as the admin).
func Apply(ctx context.Context, cfg *rest.Config, namespace string, objs ...*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	return apply(ctx, cfg, namespace, nil, objs)
}

// ApplyDryRun validates objects with the apiserver (admission included)
// without storing them: for manifests whose effects a test does not want,
// such as a DaemonSet whose image no node has.
func ApplyDryRun(ctx context.Context, cfg *rest.Config, namespace string, objs ...*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	return apply(ctx, cfg, namespace, []string{metav1.DryRunAll}, objs)
}

func apply(ctx context.Context, cfg *rest.Config, namespace string, dryRun []string, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := newMapper(cfg)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dc.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = namespace
			}
			obj.SetNamespace(ns)
			ri = dc.Resource(mapping.Resource).Namespace(ns)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return out, err
		}
		force := true
		got, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "hwdra-e2e", Force: &force, DryRun: dryRun})
		if err != nil {
			return out, fmt.Errorf("apply %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		out = append(out, got)
	}
	return out, nil
}

func newMapper(cfg *rest.Config) (*restmapper.DeferredDiscoveryRESTMapper, error) {
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)), nil
}
