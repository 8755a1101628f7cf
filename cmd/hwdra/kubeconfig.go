// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// errNoKubeConfig is wrapped where no kubeconfig is found at all.
var errNoKubeConfig = errors.New("no kubeconfig")

// kubeConfig finds the API server as kubectl does: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, else the pod's service account
// (in-cluster). It also says where the configuration came from, for
// messages about the server. Without any, the error says how to give one.
func kubeConfig(explicit string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = explicit
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, "", fmt.Errorf("%w: give one with --kubeconfig FILE or $KUBECONFIG, or put it at %s; in a pod, the pod's service account is used", errNoKubeConfig, clientcmd.RecommendedHomeFile)
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	source := "in-cluster service account"
	if raw, err := cc.RawConfig(); err == nil && raw.Contexts[raw.CurrentContext] != nil {
		switch env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); {
		case explicit != "":
			source = "--kubeconfig " + explicit
		case env != "":
			source = "$KUBECONFIG " + env
		default:
			source = clientcmd.RecommendedHomeFile
		}
	}
	return rc, source, nil
}
