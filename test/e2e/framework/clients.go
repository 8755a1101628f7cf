// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The agent's identity as the chart defines it.
const (
	AgentNamespace      = "hwdra-system"
	AgentServiceAccount = "hwdra-agent"
)

func (n *Node) clientFromKubeconfig(path string) (*rest.Config, *kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	return cfg, cs, err
}

func (n *Node) adminClient() (*kubernetes.Clientset, error) {
	_, cs, err := n.clientFromKubeconfig(n.kubeconfigs["admin"])
	return cs, err
}

// AgentCredentials are a service-account token of the agent, bound to a
// node object the way a DaemonSet pod's projected token is: the apiserver then
// tells authorizers and admission policies the node
// (user.extra["authentication.kubernetes.io/node-name"]).
type AgentCredentials struct {
	Kubeconfig string
	Config     *rest.Config
	Client     *kubernetes.Clientset
}

// AgentCredentials mints a token for the agent's ServiceAccount bound to the
// named node (this node when nodeName is ""), and a kubeconfig with it.
// The chart must be installed (it creates the ServiceAccount).
func (n *Node) AgentCredentials(ctx context.Context, nodeName string) (*AgentCredentials, error) {
	if nodeName == "" {
		nodeName = n.Name
	}
	node, err := n.Admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node to bind the token to: %w", err)
	}
	return n.agentCredentials(ctx, "agent-"+nodeName, &authenticationv1.BoundObjectReference{
		APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
	})
}

// UnboundAgentCredentials are the agent's ServiceAccount with a token bound
// to no object, so its user info names no node.
func (n *Node) UnboundAgentCredentials(ctx context.Context) (*AgentCredentials, error) {
	return n.agentCredentials(ctx, "agent-unbound", nil)
}

func (n *Node) agentCredentials(ctx context.Context, name string, ref *authenticationv1.BoundObjectReference) (*AgentCredentials, error) {
	return n.serviceAccountCredentials(ctx, AgentNamespace, AgentServiceAccount, name, ref)
}

// ServiceAccountCredentials mints a token for a ServiceAccount, bound to
// no object, and a kubeconfig with it: a user of the cluster as RBAC
// sees one.
func (n *Node) ServiceAccountCredentials(ctx context.Context, namespace, serviceAccount string) (*AgentCredentials, error) {
	return n.serviceAccountCredentials(ctx, namespace, serviceAccount, "sa-"+namespace+"-"+serviceAccount, nil)
}

func (n *Node) serviceAccountCredentials(ctx context.Context, namespace, serviceAccount, name string, ref *authenticationv1.BoundObjectReference) (*AgentCredentials, error) {
	expiry := int64((2 * time.Hour).Seconds())
	tr, err := n.Admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry, BoundObjectRef: ref},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", namespace, serviceAccount, err)
	}
	path := filepath.Join(n.Root, "cp", name+".kubeconfig")
	if err := writeKubeconfig(path, "127.0.0.1", n.pki.CACert, tr.Status.Token); err != nil {
		return nil, err
	}
	cfg, cs, err := n.clientFromKubeconfig(path)
	if err != nil {
		return nil, err
	}
	return &AgentCredentials{Kubeconfig: path, Config: cfg, Client: cs}, nil
}
