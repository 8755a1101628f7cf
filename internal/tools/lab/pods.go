// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// resolver turns pods into the claims the cluster would allocate for
// them: the ResourceClaims they name, one claim per pod from each
// template they name (as the resourceclaim controller makes it), and one
// for their extended resources (as kube-scheduler makes it).
type resolver struct {
	claims map[string]*readClaim // claimKey
	// extended maps an extended resource to its DeviceClass as the
	// scheduler's cache does: a class's extendedResourceName, and
	// deviceclass.resource.kubernetes.io/<class> for every class.
	extended *extendedresourcecache.ExtendedResourceCache
	// owner is the group that allocates a ResourceClaim that several
	// pods name: the first pod's.
	owner map[*resourceapi.ResourceClaim]string
	// incomplete: documents had errors, so a claim not found may be one.
	incomplete bool
}

func newResolver(claims map[string]*readClaim, classes []*resourceapi.DeviceClass) *resolver {
	r := &resolver{claims: claims, extended: extendedresourcecache.NewExtendedResourceCache(klog.Background()), owner: map[*resourceapi.ResourceClaim]string{}}
	for _, c := range classes {
		r.extended.OnAdd(c, true)
	}
	return r
}

// pod resolves one pod: its group of claims (maybe none) and a line that
// says what it gets, or its errors, each naming the file, the object (the
// pod, or the workload whose pods it is) and the field: every problem of
// the pod, not the first.
func (r *resolver) pod(p *readPod) (claimGroup, []string, error) {
	pod := p.pod
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	object := p.owner
	if object == "" {
		object = "Pod " + pod.Namespace + "/" + pod.Name
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %s: %s", p.at, object, field, fmt.Sprintf(format, args...))
	}
	name := p.at + ": Pod " + pod.Namespace + "/" + pod.Name
	g := claimGroup{name: name}
	var (
		got  []string
		errs []error
	)
	podClaims := map[string]bool{}
	for i, pc := range pod.Spec.ResourceClaims {
		field := fmt.Sprintf("%s.resourceClaims[%d]", p.spec, i)
		podClaims[pc.Name] = true
		switch {
		case (pc.ResourceClaimName == nil) == (pc.ResourceClaimTemplateName == nil):
			errs = append(errs, fail(field, "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"))
		case pc.ResourceClaimName != nil:
			c, err := r.find(false, pod.Namespace, *pc.ResourceClaimName)
			if err != nil {
				errs = append(errs, fail(field+".resourceClaimName", "%v", err))
				continue
			}
			c.used = true
			if first, ok := r.owner[c.claim]; ok {
				// A claim that several pods name is allocated once.
				got = append(got, fmt.Sprintf("%s (ResourceClaim, allocated with %s)", c.claim.Name, first))
				continue
			}
			r.owner[c.claim] = name
			g.claims = append(g.claims, c.claim)
			got = append(got, c.claim.Name+" (ResourceClaim)")
		default:
			t, err := r.find(true, pod.Namespace, *pc.ResourceClaimTemplateName)
			if err != nil {
				errs = append(errs, fail(field+".resourceClaimTemplateName", "%v", err))
				continue
			}
			t.used = true
			c := fromTemplate(pod, pc.Name, t.template)
			g.claims = append(g.claims, c)
			got = append(got, fmt.Sprintf("%s (from ResourceClaimTemplate %s)", c.Name, t.template.Name))
		}
	}
	// As the API server: a container's claim is one of the pod's.
	for i, c := range allContainers(pod) {
		for j, cc := range c.Resources.Claims {
			if !podClaims[cc.Name] {
				errs = append(errs, fail(fmt.Sprintf("%s.%s.resources.claims[%d].name", p.spec, containerField(pod, i), j),
					"%q: must be the name of one entry in %s.resourceClaims", cc.Name, p.spec))
			}
		}
	}
	ext, line, err := r.extendedClaim(p, fail)
	if err := errors.Join(append(errs, err)...); err != nil {
		return g, nil, err
	}
	if ext != nil {
		g.claims = append(g.claims, ext)
		got = append(got, line)
	}
	if len(g.claims) == 0 && len(got) == 0 {
		return g, []string{name + ": asks for no devices"}, nil
	}
	if p.owner != "" {
		name += " (of " + p.owner + ")"
	}
	return g, []string{name + ": claims " + strings.Join(got, ", ")}, nil
}

// find looks up a claim or template a pod names in its namespace.
func (r *resolver) find(template bool, namespace, name string) (*readClaim, error) {
	key := claimKey(template, namespace, name)
	if c, ok := r.claims[key]; ok {
		return c, nil
	}
	msg := key + " is in none of the files given"
	// A namespace left out or mistyped is the likely cause: name where it is.
	var elsewhere []string
	for _, c := range r.claims {
		if c.claim.Name == name && (c.template != nil) == template {
			elsewhere = append(elsewhere, c.claim.Namespace)
		}
	}
	if len(elsewhere) > 0 {
		slices.Sort(elsewhere)
		msg += fmt.Sprintf(" (there is one in namespace %s: a pod takes claims of its own namespace only)", strings.Join(elsewhere, ", "))
	}
	if r.incomplete {
		msg += " (or it is in a document whose errors are said)"
	}
	return nil, fmt.Errorf("%s", msg)
}

// fromTemplate makes a pod's claim from a template as the resourceclaim
// controller does (k8s.io/kubernetes pkg/controller/resourceclaim
// handleClaim): named <pod>-<pod claim>-<random> (both parts shortened
// alike past 57 characters), the template's labels, its annotations and
// the pod claim's name, owned by the pod.
func fromTemplate(pod *corev1.Pod, podClaim string, t *resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaim {
	const maxBase = 57 // room for 5 random characters in 63
	base := pod.Name + "-" + podClaim + "-"
	if len(base) > maxBase {
		base = pod.Name[:len(pod.Name)*maxBase/len(base)] + "-" + podClaim[:len(podClaim)*maxBase/len(base)]
	}
	annotations := maps.Clone(t.Spec.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[resourceapi.PodResourceClaimAnnotation] = podClaim
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:            names.SimpleNameGenerator.GenerateName(base),
			Namespace:       pod.Namespace,
			Labels:          t.Spec.Labels,
			Annotations:     annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, Controller: ptr.To(true)}},
		},
		Spec: *t.Spec.Spec.DeepCopy(),
	}
	c.UID = claimUID(c)
	return c
}

// extendedClaim is the claim kube-scheduler makes for the extended
// resources a pod asks for where no device plugin serves them (none does
// in the lab) and a DeviceClass does (k8s.io/kubernetes
// pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go:
// named <pod>-extended-resources-<random>, annotated, a request per
// container and resource from createRequestsAndMappings). An extended
// resource no class serves fits no node here: an error, as the pod would
// stay Pending.
func (r *resolver) extendedClaim(p *readPod, fail func(field, format string, args ...any) error) (*resourceapi.ResourceClaim, string, error) {
	pod := p.pod
	containers := allContainers(pod)
	// The API server's defaults: a request left out is the limit.
	requests := make([]corev1.ResourceList, len(containers))
	classes := map[corev1.ResourceName]string{}
	var errs []error
	for i, c := range containers {
		requests[i] = maps.Clone(c.Resources.Requests)
		if requests[i] == nil {
			requests[i] = corev1.ResourceList{}
		}
		for name, q := range c.Resources.Limits {
			if _, ok := requests[i][name]; !ok {
				requests[i][name] = q
			}
		}
		for name, q := range requests[i] {
			if !isDRAExtendedResource(name) {
				continue
			}
			field := fmt.Sprintf("%s.%s.resources.limits[%s]", p.spec, containerField(pod, i), name)
			if _, ok := c.Resources.Requests[name]; ok {
				field = fmt.Sprintf("%s.%s.resources.requests[%s]", p.spec, containerField(pod, i), name)
			}
			if _, ok := q.AsInt64(); !ok {
				errs = append(errs, fail(field, "%s: must be an integer", q.String()))
			}
			class := r.extended.GetDeviceClass(name)
			if class == nil {
				errs = append(errs, fail(field, "no DeviceClass has extendedResourceName %s (the chart's values extendedResources name the ones it offers: give yours with --values), and the lab has no device plugin to serve it", name))
				continue
			}
			classes[name] = class.Name
		}
	}
	if len(errs) > 0 {
		return nil, "", errors.Join(errs...)
	}
	reqs, resourceOf := extendedRequests(pod, requests, classes)
	if len(reqs) == 0 {
		return nil, "", nil
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:            names.SimpleNameGenerator.GenerateName(pod.Name + "-extended-resources-"),
			Namespace:       pod.Namespace,
			Annotations:     map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, Controller: ptr.To(true)}},
		},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
	c.UID = claimUID(c)
	var parts []string
	for _, req := range reqs {
		parts = append(parts, fmt.Sprintf("%s: %d %s from DeviceClass %s", req.Name, req.Exactly.Count, resourceOf[req.Name], req.Exactly.DeviceClassName))
	}
	return c, fmt.Sprintf("%s (extended resources: %s)", c.Name, strings.Join(parts, ", ")), nil
}

// extendedRequests are the scheduler's requests for a pod's extended
// resources (createRequestsAndMappings): per resource, a request for each
// regular or sidecar container that asks for it, and one for the
// largest ask of the other init containers beyond what those later
// containers' requests already hold (they run before them, on the same
// devices); named container-<i>-request-<j>, i the container's index
// among init and regular containers, j the resource's among the
// container's sorted requests; with the resource of each.
func extendedRequests(pod *corev1.Pod, requests []corev1.ResourceList, classes map[corev1.ResourceName]string) ([]resourceapi.DeviceRequest, map[string]corev1.ResourceName) {
	nInit := len(pod.Spec.InitContainers)
	containers := allContainers(pod)
	longLived := func(i int) bool {
		return i >= nInit || containers[i].RestartPolicy != nil && *containers[i].RestartPolicy == corev1.ContainerRestartPolicyAlways
	}
	request := func(i int, name corev1.ResourceName, reusable []*resourceapi.DeviceRequest) *resourceapi.DeviceRequest {
		q, ok := requests[i][name]
		if !ok {
			return nil
		}
		n, _ := q.AsInt64()
		if n == 0 {
			return nil
		}
		for _, r := range reusable {
			if r != nil {
				n -= r.Exactly.Count
				if n <= 0 {
					return nil
				}
			}
		}
		keys := slices.Sorted(maps.Keys(requests[i]))
		return &resourceapi.DeviceRequest{
			Name: fmt.Sprintf("container-%d-request-%d", i, slices.Index(keys, name)),
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: classes[name], AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: n,
			},
		}
	}
	var out []resourceapi.DeviceRequest
	resourceOf := map[string]corev1.ResourceName{}
	for _, name := range slices.Sorted(maps.Keys(classes)) {
		long := make([]*resourceapi.DeviceRequest, len(containers))
		for i := range containers {
			if longLived(i) {
				long[i] = request(i, name, nil)
			}
		}
		var most *resourceapi.DeviceRequest
		for i := range nInit {
			if longLived(i) {
				continue
			}
			if r := request(i, name, long[i:]); r != nil && (most == nil || most.Exactly.Count < r.Exactly.Count) {
				most = r
			}
		}
		for _, r := range append(long, most) {
			if r != nil {
				out = append(out, *r)
				resourceOf[r.Name] = name
			}
		}
	}
	slices.SortFunc(out, func(a, b resourceapi.DeviceRequest) int { return strings.Compare(a.Name, b.Name) })
	return out, resourceOf
}

// isDRAExtendedResource is the scheduler's IsDRAExtendedResourceName
// (k8s.io/kubernetes pkg/scheduler/util, pkg/apis/core/v1/helper): an
// extended resource (not kubernetes.io's, not a quota's "requests.",
// a qualified name) or a class's implicit one.
func isDRAExtendedResource(name corev1.ResourceName) bool {
	n := string(name)
	if strings.HasPrefix(n, resourceapi.ResourceDeviceClassPrefix) {
		return true
	}
	native := !strings.Contains(n, "/") || strings.Contains(n, corev1.ResourceDefaultNamespacePrefix)
	return !native && !strings.HasPrefix(n, corev1.DefaultResourceRequestsPrefix) &&
		len(validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix+n)) == 0
}

// allContainers are a pod's init containers, then its containers, as the
// scheduler indexes them.
func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...)
}

// containerField is the field of allContainers(pod)[i].
func containerField(pod *corev1.Pod, i int) string {
	if n := len(pod.Spec.InitContainers); i >= n {
		return fmt.Sprintf("containers[%d]", i-n)
	}
	return fmt.Sprintf("initContainers[%d]", i)
}
