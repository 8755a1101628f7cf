// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The suite installs the agent as an operator does (README "Install from a
// registry"): hack/push.sh pushes the image index (linux/amd64 and
// linux/arm64) and the chart to a registry, the chart is installed from
// there into a namespace created with its Pod Security label, and the
// node's containerd pulls the image of its platform. The registry is
// go-containerregistry's, in the test process, on loopback inside the
// run's network namespace, over HTTP (containerd and helm take HTTP for a
// loopback registry; helm is told --plain-http).
const (
	registryAddr = "127.0.0.1:5000"
	// registryListen and workerRegistryAddr: the same registry.
	registryListen     = ":5000"
	workerRegistryAddr = NodeIP + ":5000"
	// registryPath is what hack/push.sh is given: the image goes to
	// registryPath/hwdra, the chart to registryPath/charts/hwdra.
	registryPath = registryAddr + "/e2e"
	// AgentChart is the chart's reference in the registry.
	AgentChart = "oci://" + registryPath + "/charts/hwdra"
	// PodSecurityLabel is the label the agent's namespace needs where Pod
	// Security admission enforces baseline (as the suite's API server
	// does for every namespace without a label).
	PodSecurityLabel = "pod-security.kubernetes.io/enforce"
)

var (
	registryOnce sync.Once
	registryErr  error
	pushOnce     sync.Once
	pushErr      error
	// AgentImageDigests are the pushed digests by tag: an image index for
	// AgentImageTag, an image for AgentImageTagNext.
	AgentImageDigests = map[string]string{}
)

// startRegistry serves the in-process registry (once per run).
func startRegistry() error {
	registryOnce.Do(func() {
		// Every address of the run's namespace: the tests and the single
		// node pull from loopback, a cluster's workers from NodeIP.
		l, err := net.Listen("tcp", registryListen)
		if err != nil {
			registryErr = fmt.Errorf("registry on %s: %w", registryListen, err)
			return
		}
		srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
	})
	return registryErr
}

// pushAgentImages pushes both tags' image archives and charts with
// hack/push.sh (once per run).
func (n *Node) pushAgentImages(ctx context.Context) error {
	pushOnce.Do(func() {
		if pushErr = startRegistry(); pushErr != nil {
			return
		}
		archives, err := buildAgentImages(filepath.Join(os.Getenv(envRoot), "agent-image"))
		if err != nil {
			pushErr = err
			return
		}
		helm, err := buildHelm()
		if err != nil {
			pushErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			pushErr = err
			return
		}
		home := filepath.Join(os.Getenv(envRoot), "push-home")
		for i, tag := range []string{AgentImageTag, AgentImageTagNext} {
			cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "push.sh"), registryPath, "--plain-http")
			cmd.Dir = root
			// No module proxy in the namespace: what push.sh compiles
			// must come from the module cache.
			cmd.Env = append(os.Environ(), "HWDRA_IMAGE_ARCHIVE="+archives[i], "HWDRA_IMAGE_TAG="+tag, "HELM="+helm,
				"GOPROXY=off", "DOCKER_CONFIG="+filepath.Join(home, "docker"),
				"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
				"HELM_DATA_HOME="+filepath.Join(home, "data"))
			out, err := cmd.Output()
			if err != nil {
				pushErr = fmt.Errorf("hack/push.sh (tag %s): %v: %s", tag, err, exitStderr(err))
				return
			}
			ref := strings.TrimSpace(string(out))
			_, digest, ok := strings.Cut(ref, "@")
			if !ok {
				pushErr = fmt.Errorf("hack/push.sh (tag %s) printed %q, want REF@DIGEST", tag, ref)
				return
			}
			AgentImageDigests[tag] = digest
		}
	})
	return pushErr
}

// ensureAgentNamespace creates the agent's namespace with its Pod Security
// label, as the README's install does (kubectl create namespace, kubectl
// label), or puts the label on one that exists.
func (n *Node) ensureAgentNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: AgentNamespace, Labels: map[string]string{PodSecurityLabel: "privileged"}}}
	_, err := n.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := n.Admin.CoreV1().Namespaces().Get(ctx, AgentNamespace, metav1.GetOptions{})
	if err != nil || cur.Labels[PodSecurityLabel] == "privileged" {
		return err
	}
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	cur.Labels[PodSecurityLabel] = "privileged"
	_, err = n.Admin.CoreV1().Namespaces().Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// podSecurityAdmission is the API server's admission configuration: Pod
// Security enforces baseline on every namespace that does not say
// otherwise, as hardened clusters do.
const podSecurityAdmission = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: latest
`
