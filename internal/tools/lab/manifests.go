// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/hwdra/hwdra/api"
	"github.com/hwdra/hwdra/internal/tools/claimspec"
)

// manifest is what one document of a --claim file holds for the lab:
// claims and claim templates, pods (a Pod's, or those a workload would
// run), or a line saying why it is skipped; a List holds several.
type manifest struct {
	claims  []*readClaim
	pods    []*readPod
	classes []*readClass
	notes   []string
}

// readClass is a DeviceClass of the files: the lab allocates with it,
// beside the chart's or over one of the same name.
type readClass struct {
	at    string
	class *resourceapi.DeviceClass
}

// readClaim is a ResourceClaim or a ResourceClaimTemplate as read,
// defaulted and validated. A template's claim is the one it stands for
// where no pod names it (the template's name and spec); a pod that names
// it gets one made from it.
type readClaim struct {
	at       string // "file, document 2"
	claim    *resourceapi.ResourceClaim
	template *resourceapi.ResourceClaimTemplate // nil for a ResourceClaim
	used     bool                               // named by a pod
}

// readPod is a pod to place: a Pod, or one of a workload's.
type readPod struct {
	at    string
	pod   *corev1.Pod
	owner string // "Deployment ns/name", "" for a Pod
	spec  string // the pod spec's field path in the document: "spec", "spec.template.spec", ...
}

// decodeDocument decodes one document of file (at names it) strictly as
// the kind it says it is.
func decodeDocument(at string, doc json.RawMessage) (manifest, error) {
	head, err := readHead(doc)
	if err != nil {
		return manifest{}, fmt.Errorf("%s: %w", at, err)
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if head.APIVersion == "" || head.Kind == "" || err != nil {
		return manifest{}, fmt.Errorf("%s: apiVersion %q, kind %q: want both, as kubectl does", at, head.APIVersion, head.Kind)
	}
	gvk := gv.WithKind(head.Kind)
	name := head.Metadata.Name
	if name == "" {
		name = head.Metadata.GenerateName + "*"
	}
	if head.Metadata.Namespace != "" {
		name = head.Metadata.Namespace + "/" + name
	}
	object := at + ": " + gvk.Kind + " " + name
	if strings.HasSuffix(head.Kind, "List") {
		// kubectl's List (v1 List, or <Kind>List): each item on its own.
		var items []json.RawMessage
		if err := json.Unmarshal(head.Items, &items); err != nil && len(head.Items) > 0 {
			return manifest{}, fmt.Errorf("%s: items: must be a list, not %s", object, jsonKind(head.Items))
		}
		var out manifest
		var errs []error
		for i, item := range items {
			m, err := decodeDocument(fmt.Sprintf("%s, items[%d]", at, i), item)
			errs = append(errs, err)
			out.claims = append(out.claims, m.claims...)
			out.pods = append(out.pods, m.pods...)
			out.classes = append(out.classes, m.classes...)
			out.notes = append(out.notes, m.notes...)
		}
		return out, errors.Join(errs...)
	}
	m, err := decodeObject(gvk, doc, at, object)
	if err != nil {
		return m, fmt.Errorf("%s: %w", object, err)
	}
	return m, nil
}

// decodeObject decodes one object strictly as its kind; at is its place
// in the files, object names it for notes.
func decodeObject(gvk schema.GroupVersionKind, doc json.RawMessage, at, object string) (manifest, error) {
	gv := gvk.GroupVersion()
	strict := func(into any) error { return api.Unmarshal(doc, into) }
	m, known, err := decodeResourceObject(gvk, strict, at)
	if err == nil && !known {
		m, known, err = decodeWorkload(gvk, strict, at)
	}
	if err != nil {
		return m, err
	}
	if !known {
		return skipObject(gvk, object)
	}
	if gv.Version != resourceapi.SchemeGroupVersion.Version && gv.Group == resourceapi.GroupName {
		m.notes = append(m.notes, fmt.Sprintf("%s: %s, converted to %s as the API server does", object, gv, resourceapi.SchemeGroupVersion))
	}
	if len(m.pods) == 0 && len(m.claims) == 0 && len(m.classes) == 0 {
		m.notes = append(m.notes, object+": runs no pod (0 replicas)")
	}
	return m, nil
}

// decodeResourceObject decodes a ResourceClaim, ResourceClaimTemplate or
// DeviceClass of any served version; known is false for other kinds.
func decodeResourceObject(gvk schema.GroupVersionKind, strict func(any) error, at string) (m manifest, known bool, _ error) {
	gv := gvk.GroupVersion()
	switch gvk {
	case resourceapi.SchemeGroupVersion.WithKind("ResourceClaim"),
		resourcev1beta2.SchemeGroupVersion.WithKind("ResourceClaim"),
		resourcev1beta1.SchemeGroupVersion.WithKind("ResourceClaim"):
		c, err := claimspec.DecodeClaim(gv.Version, strict)
		if err == nil {
			err = prepareClaim(c, nil)
		}
		if err != nil {
			return m, true, err
		}
		m.claims = append(m.claims, &readClaim{at: at, claim: c})
	case resourceapi.SchemeGroupVersion.WithKind("ResourceClaimTemplate"),
		resourcev1beta2.SchemeGroupVersion.WithKind("ResourceClaimTemplate"),
		resourcev1beta1.SchemeGroupVersion.WithKind("ResourceClaimTemplate"):
		t, err := claimspec.DecodeTemplate(gv.Version, strict)
		c := &resourceapi.ResourceClaim{}
		if err == nil {
			c.ObjectMeta, c.Spec = t.ObjectMeta, t.Spec.Spec
			err = prepareClaim(c, t)
		}
		if err != nil {
			return m, true, err
		}
		t.Namespace, t.Spec.Spec = c.Namespace, c.Spec // defaulted
		m.claims = append(m.claims, &readClaim{at: at, claim: c, template: t})
	case resourceapi.SchemeGroupVersion.WithKind("DeviceClass"),
		resourcev1beta2.SchemeGroupVersion.WithKind("DeviceClass"),
		resourcev1beta1.SchemeGroupVersion.WithKind("DeviceClass"):
		c, err := decodeClass(strict)
		if err != nil {
			return m, true, err
		}
		m.classes = append(m.classes, &readClass{at: at, class: c})
	default:
		return m, false, nil
	}
	return m, true, nil
}

// decodeWorkload decodes a Pod or a workload (its pods, as its controller
// would name them); known is false for other kinds.
func decodeWorkload(gvk schema.GroupVersionKind, strict func(any) error, at string) (m manifest, known bool, _ error) {
	switch gvk {
	case corev1.SchemeGroupVersion.WithKind("Pod"):
		p := &corev1.Pod{}
		if err := strict(p); err != nil {
			return m, true, err
		}
		if p.Name == "" && p.GenerateName != "" {
			p.Name = names.SimpleNameGenerator.GenerateName(p.GenerateName)
		}
		m.pods = append(m.pods, &readPod{at: at, pod: p, spec: "spec"})
	case appsv1.SchemeGroupVersion.WithKind("Deployment"):
		d := &appsv1.Deployment{}
		if err := strict(d); err != nil {
			return m, true, err
		}
		// A Deployment's pods are its ReplicaSet's: <deployment>-<hash>-<random>.
		rs := names.SimpleNameGenerator.GenerateName(d.Name + "-")
		m.pods = workloadPods(at, gvk.Kind, &d.ObjectMeta, &d.Spec.Template, "spec.template.spec", replicas(d.Spec.Replicas), generated(rs))
	case appsv1.SchemeGroupVersion.WithKind("ReplicaSet"):
		r := &appsv1.ReplicaSet{}
		if err := strict(r); err != nil {
			return m, true, err
		}
		m.pods = workloadPods(at, gvk.Kind, &r.ObjectMeta, &r.Spec.Template, "spec.template.spec", replicas(r.Spec.Replicas), generated(r.Name))
	case appsv1.SchemeGroupVersion.WithKind("StatefulSet"):
		s := &appsv1.StatefulSet{}
		if err := strict(s); err != nil {
			return m, true, err
		}
		m.pods = workloadPods(at, gvk.Kind, &s.ObjectMeta, &s.Spec.Template, "spec.template.spec", replicas(s.Spec.Replicas),
			func(i int) string { return fmt.Sprintf("%s-%d", s.Name, i) })
	case appsv1.SchemeGroupVersion.WithKind("DaemonSet"):
		d := &appsv1.DaemonSet{}
		if err := strict(d); err != nil {
			return m, true, err
		}
		// The lab is one node: one pod.
		m.pods = workloadPods(at, gvk.Kind, &d.ObjectMeta, &d.Spec.Template, "spec.template.spec", 1, generated(d.Name))
	case batchv1.SchemeGroupVersion.WithKind("Job"):
		j := &batchv1.Job{}
		if err := strict(j); err != nil {
			return m, true, err
		}
		m.pods = workloadPods(at, gvk.Kind, &j.ObjectMeta, &j.Spec.Template, "spec.template.spec", jobPods(j.Spec), generated(j.Name))
	case batchv1.SchemeGroupVersion.WithKind("CronJob"):
		c := &batchv1.CronJob{}
		if err := strict(c); err != nil {
			return m, true, err
		}
		// One run: a Job <cronjob>-<scheduled time>, its pods <job>-<random>.
		job := names.SimpleNameGenerator.GenerateName(c.Name + "-")
		m.pods = workloadPods(at, gvk.Kind, &c.ObjectMeta, &c.Spec.JobTemplate.Spec.Template, "spec.jobTemplate.spec.template.spec",
			jobPods(c.Spec.JobTemplate.Spec), generated(job))
	default:
		return m, false, nil
	}
	return m, true, nil
}

// skipObject says why an object of a kind the lab does not read is
// skipped; a kind of a built-in group that does not exist is a typo.
func skipObject(gvk schema.GroupVersionKind, object string) (manifest, error) {
	var m manifest
	gv := gvk.GroupVersion()
	if scheme.Scheme.IsGroupRegistered(gv.Group) && !scheme.Scheme.Recognizes(gvk) {
		return m, fmt.Errorf("no kind %s in %s", gvk.Kind, gv)
	}
	why := "the lab reads ResourceClaims, ResourceClaimTemplates, DeviceClasses, Pods and the pods of Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs"
	if gv.Group == resourceapi.GroupName && gvk.Kind == "ResourceSlice" {
		why = "the lab publishes the slices of --hardware"
	}
	m.notes = append(m.notes, fmt.Sprintf("%s: skipped (%s)", object, why))
	return m, nil
}

// decodeClass decodes a DeviceClass of any served version as v1: the
// versions' DeviceClassSpecs are the same fields. Its name is required,
// as the API server requires it.
func decodeClass(strict func(any) error) (*resourceapi.DeviceClass, error) {
	c := &resourceapi.DeviceClass{}
	if err := strict(c); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, errors.New("metadata.name: Required value (a DeviceClass's name is what claims ask for)")
	}
	if c.Namespace != "" {
		return nil, fmt.Errorf("metadata.namespace: Invalid value %q: a DeviceClass is cluster-scoped", c.Namespace)
	}
	return c, nil
}

// workloadPods are the pods a workload runs from its template, n of
// them, named by name(i), in the workload's namespace.
func workloadPods(at, kind string, meta *metav1.ObjectMeta, template *corev1.PodTemplateSpec, spec string, n int, name func(int) string) []*readPod {
	if meta.Namespace == "" {
		meta.Namespace = "default" // kubectl's
	}
	owner := kind + " " + meta.Namespace + "/" + meta.Name
	var pods []*readPod
	for i := range n {
		p := &corev1.Pod{ObjectMeta: *template.ObjectMeta.DeepCopy(), Spec: *template.Spec.DeepCopy()}
		p.Name, p.GenerateName, p.Namespace = name(i), "", meta.Namespace
		pods = append(pods, &readPod{at: at, pod: p, owner: owner, spec: spec})
	}
	return pods
}

// replicas defaults as the API server does: 1.
func replicas(n *int32) int {
	if n == nil {
		return 1
	}
	return int(*n)
}

// jobPods is how many pods a Job runs at once: its parallelism (1 by
// default), at most its completions.
func jobPods(spec batchv1.JobSpec) int {
	n := replicas(spec.Parallelism)
	if spec.Completions != nil {
		n = min(n, int(*spec.Completions))
	}
	return n
}

// generated names pods as a controller does: <owner>-<random>.
func generated(owner string) func(int) string {
	return func(int) string { return names.SimpleNameGenerator.GenerateName(owner + "-") }
}
