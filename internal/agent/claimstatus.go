// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// gpuClaimStatus starts the writer of GPU claims' status.devices, on the
// status client (its own rate limiter: prepare's claim GETs never wait
// behind it); nil with gpus.claimStatus Off.
func gpuClaimStatus(ctx context.Context, cfg *config.AgentConfig, client kubernetes.Interface, m *metrics) *metadata.StatusWriter {
	if !cfg.GPUPolicy().WritesClaimStatus() {
		klog.FromContext(ctx).Info("GPU claim status is off (gpus.claimStatus: Off): prepared GPU devices get no status.devices entries")
		return nil
	}
	w := metadata.NewStatusWriter(client, device.GPUDriver, m)
	go w.Run(ctx)
	return w
}

// gpuStatusReporter queues a GPU claim's status once the plugin has
// prepared it (prepare.Reporter): the write happens in the writer's
// goroutine, never on prepare's path.
type gpuStatusReporter struct{ w *metadata.StatusWriter }

func (r gpuStatusReporter) Prepared(claim *resourceapi.ResourceClaim, c prepare.Claim[gpuprep.Record]) {
	r.w.Set(metadata.ClaimStatus{Claim: metadata.ClaimRef{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name},
		Devices: gpuprep.Statuses(c), Time: metav1.Now()})
}
