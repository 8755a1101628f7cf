// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"

	"github.com/hwdra/hwdra/internal/agent/publish"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// The API server: it answers, serves DRA's resource.k8s.io/v1, and keeps
// the fields of the DRA features the device model uses (the publisher's
// own dry-run probe).

// apiTimeout bounds the API checks together.
const apiTimeout = 20 * time.Second

func (r *run) api(ctx context.Context) []Check {
	server := Check{ID: "api-server"}
	dra := Check{ID: "dra-api", Status: Skip}
	features := Check{ID: "dra-features", Status: Skip}
	skip := func(why string) []Check {
		dra.Summary, features.Summary = why, why
		return []Check{server, dra, features}
	}
	a := r.in.API
	switch {
	case a.Client == nil && a.Err != nil:
		server.Status, server.Summary = Warn, "API checks skipped: "+a.Err.Error()
		server.Fix = "give a kubeconfig that works with --kubeconfig, or leave the API checks out"
		return skip("skipped: no API server")
	case a.Client == nil:
		server.Status, server.Summary = Skip, "API checks skipped: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config, or a pod's service account)"
		return skip("skipped: no API server")
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	disc := discovery.ToDiscoveryInterfaceWithContext(a.Client.Discovery())
	v, err := disc.ServerVersionWithContext(ctx)
	if err != nil {
		server.Status = Blocker
		server.Summary = fmt.Sprintf("the API server %s does not answer: %v", a.Server, err)
		server.Fix = "check the kubeconfig's address and credentials, and that the node reaches the API server (the agent finds it as kubectl does)"
		return skip("skipped: the API server does not answer")
	}
	server.Status, server.Summary = OK, fmt.Sprintf("the API server %s answers: Kubernetes %s", a.Server, v.GitVersion)

	gv := resourceapi.SchemeGroupVersion.String()
	list, err := disc.ServerResourcesForGroupVersionWithContext(ctx, gv)
	served := false
	if err == nil {
		for _, res := range list.APIResources {
			served = served || res.Name == "resourceslices"
		}
	}
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		dra.Status, dra.Summary = Warn, fmt.Sprintf("cannot tell whether the API server serves %s: %v", gv, err)
		dra.Fix = "use a kubeconfig whose user may read the API server's discovery"
	case !served:
		dra.Status, dra.Summary = Blocker, fmt.Sprintf("the API server does not serve %s ResourceSlices: the agent publishes nothing", gv)
		dra.Fix = "Kubernetes 1.34 or later serves DRA's resource.k8s.io/v1 (hwdra is built for 1.37)"
		features.Summary = "skipped: no DRA API"
		return []Check{server, dra, features}
	default:
		dra.Status, dra.Summary = OK, fmt.Sprintf("%s served (ResourceSlices, ResourceClaims, DeviceClasses)", gv)
	}
	return []Check{server, dra, r.draFeatures(ctx)}
}

// draFeatures asks, as the publisher does before it publishes, which DRA
// features' fields the API server keeps, and says what the agent leaves
// out for each it drops.
func (r *run) draFeatures(ctx context.Context) Check {
	c := Check{ID: "dra-features"}
	driver := device.GPUDriver
	if r.gpu == nil && !r.pendingNVML() && len(vfioGPUs(r.in.Node.SysfsRoot)) == 0 && len(r.offers) > 0 {
		driver = device.NICDriver
	}
	f, err := publish.ProbeFeatures(ctx, r.in.API.Client, r.in.NodeName, driver)
	if err != nil {
		c.Status, c.Summary = Warn, "cannot tell: "+err.Error()
		c.Fix = "the check is a dry-run create of a ResourceSlice: use a kubeconfig that may create them (the agent's service account may, for its node and drivers); the agent checks at start and says what it finds in its log and /readyz"
		if apierrors.IsForbidden(err) {
			c.Summary = "cannot tell: this kubeconfig may not create ResourceSlices (a dry run): " + err.Error()
		}
		return c
	}
	var off []string
	for _, g := range publish.Gates(f) {
		if g.On {
			c.Details = append(c.Details, g.Name+": on")
			continue
		}
		off = append(off, g.Name)
		c.Details = append(c.Details, g.Name+": off: "+g.Without)
	}
	if len(off) == 0 {
		c.Status, c.Summary = OK, fmt.Sprintf("the API server keeps the fields of every DRA feature the device model uses (dry run, %s on node %s)", driver, r.in.NodeName)
		return c
	}
	c.Status = Warn
	c.Summary = fmt.Sprintf("the API server drops the fields of %s: the agent publishes a model without them", strings.Join(off, ", "))
	c.Fix = "turn the gates on in kube-apiserver and kube-scheduler (--feature-gates=" + strings.Join(off, "=true,") + "=true); the agent returns to the full model within --feature-check-interval"
	return c
}
