// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// criClient connects to a CRI endpoint.
func criClient(socket string) (runtimeapi.RuntimeServiceClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(conn), conn, nil
}

// removeAllSandboxes stops and removes every pod sandbox, which stops and
// removes their containers and tears down their network through CNI. Pods
// outlive the kubelet, so this is the only clean way to end them.
func removeAllSandboxes(socket string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rs, conn, err := criClient(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range resp.Items {
		if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
		}
		if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sandboxes lists the node's pod sandboxes as the runtime sees them (to
// check that nothing leaks past a pod's deletion).
func (n *Node) Sandboxes(ctx context.Context) ([]*runtimeapi.PodSandbox, error) {
	rs, conn, err := criClient(n.ContainerdSocket())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	return resp.Items, nil
}
