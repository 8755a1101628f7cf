// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// DefaultFeatureGates are the gates of the cluster hwdra targets: every DRA
// feature its slices and claims use, alpha ones included. The same set goes
// to the apiserver, scheduler, controller-manager and kubelet. (There is no
// gate for KEP-5304 device metadata: it lives in the driver library and CDI.)
func DefaultFeatureGates() map[string]bool {
	return map[string]bool{
		"DynamicResourceAllocation":    true,
		"DRAPartitionableDevices":      true,
		"DRAPartitionableDevicesType":  true,
		"DRADeviceCompatibilityGroups": true,
		"DRAConsumableCapacity":        true,
		"DRADeviceTaints":              true,
		"DRADeviceTaintRules":          true,
		"DRAResourceClaimDeviceStatus": true,
		"DRAPrioritizedList":           true,
		"DRAResourcePoolStatus":        true,
		// Granular status authorization is what lets RBAC restrict the
		// agent's status.devices writes to its own drivers and node.
		"DRAResourceClaimGranularStatusAuthorization": true,
	}
}

// gatesSince are the gates of DefaultFeatureGates (and of variants) that Kubernetes added
// after 1.36, by the minor that added them: the suite runs on the previous
// minor too (K8S_VERSION=v1.36.3 hack/e2e-realnode.sh), whose components
// refuse a gate they do not know. Without one the cluster is as one with
// the gate off: the agent's feature check finds the field dropped.
var gatesSince = map[string]int{
	"DRADeviceCompatibilityGroups": 37,
	"DRAPartitionableDevicesType":  37,
	// Not a default: the consumable-capacity gate-off variant turns it off
	// with DRAConsumableCapacity, which it needs.
	"DRAFractionalCapacityRange": 37,
}

// dropUnknownGates removes from gates those the node's Kubernetes minor
// does not have.
func dropUnknownGates(gates map[string]bool) error {
	minor, err := KubeMinor()
	if err != nil {
		return err
	}
	for gate, since := range gatesSince {
		if minor < since {
			delete(gates, gate)
		}
	}
	return nil
}

var (
	kubeVersionOnce sync.Once
	kubeVersion     string
	kubeMinor       int
	kubeVersionErr  error
)

// KubeVersion is the version of the node's Kubernetes binaries ("v1.37.2"),
// as kube-apiserver --version says.
func KubeVersion() (string, error) {
	kubeVersionOnce.Do(func() {
		out, err := exec.Command(bin("kube-apiserver"), "--version").Output()
		if err != nil {
			kubeVersionErr = fmt.Errorf("kube-apiserver --version: %w", err)
			return
		}
		kubeVersion = strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes ")
		var major, patch int
		if _, err := fmt.Sscanf(kubeVersion, "v%d.%d.%d", &major, &kubeMinor, &patch); err != nil || major != 1 {
			kubeVersionErr = fmt.Errorf("kube-apiserver --version said %q: want Kubernetes v1.MINOR.PATCH", out)
		}
	})
	return kubeVersion, kubeVersionErr
}

// KubeMinor is the minor version of the node's Kubernetes binaries (37 for
// v1.37.2).
func KubeMinor() (int, error) {
	_, err := KubeVersion()
	return kubeMinor, err
}

// RequireMinor skips t where the node's Kubernetes is older than 1.minor,
// saying why the test needs it.
func RequireMinor(t testing.TB, minor int, why string) {
	t.Helper()
	have, err := KubeMinor()
	if err != nil {
		t.Fatal(err)
	}
	if have < minor {
		t.Skipf("Kubernetes 1.%d here; this test needs 1.%d: %s", have, minor, why)
	}
}

// runtimeConfig enables every resource.k8s.io version, alpha included.
const runtimeConfig = "resource.k8s.io/v1alpha3=true,resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"

const (
	apiserverPort = 6443
	etcdPort      = 2379
	serviceCIDR   = "10.201.0.0/24" // virtual only: no kube-proxy runs
	serviceIP     = "10.201.0.1"
	saIssuer      = "https://kubernetes.default.svc.cluster.local"
)

func gateFlag(gates map[string]bool) string {
	var parts []string
	for k, v := range gates {
		parts = append(parts, fmt.Sprintf("%s=%t", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// identity is one static-token user of the apiserver.
type identity struct {
	name, token string
	groups      []string
}

// writeKubeconfig writes a kubeconfig that reaches the apiserver with token.
func writeKubeconfig(path, host, caFile, token string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://%s:%d
    certificate-authority: %s
users:
- name: u
  user:
    token: %s
contexts:
- name: c
  context: {cluster: e2e, user: u}
current-context: c
`, host, apiserverPort, caFile, token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// startControlPlane starts etcd, the apiserver, the controller-manager and the
// scheduler and waits until the apiserver is ready.
func (n *Node) startControlPlane(ctx context.Context) error {
	dir := filepath.Join(n.Root, "cp")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p, err := newPKI(dir)
	if err != nil {
		return err
	}
	n.pki = p
	ids := map[string]identity{
		"admin":              {"hwdra-e2e-admin", randomToken(), []string{"system:masters"}},
		"controller-manager": {"system:kube-controller-manager", randomToken(), []string{"system:masters"}},
		"scheduler":          {"system:kube-scheduler", randomToken(), nil},
		"kubelet":            {"system:node:" + n.Name, randomToken(), []string{"system:nodes"}},
	}
	for _, w := range n.Options.Workers {
		ids["kubelet-"+w] = identity{"system:node:" + w, randomToken(), []string{"system:nodes"}}
	}
	var tokens strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&tokens, "%s,%s,%s,\"%s\"\n", id.token, id.name, id.name, strings.Join(id.groups, ","))
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		return err
	}
	kc := map[string]string{}
	for name, id := range ids {
		kc[name] = filepath.Join(dir, name+".kubeconfig")
		host := "127.0.0.1"
		if strings.HasPrefix(name, "kubelet-") { // a worker's, from its own namespace
			host = NodeIP
		}
		if err := writeKubeconfig(kc[name], host, p.CACert, id.token); err != nil {
			return err
		}
	}
	n.kubeconfigs = kc
	gates := gateFlag(n.Options.FeatureGates)

	admissionFile := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(admissionFile, []byte(podSecurityAdmission), 0o644); err != nil {
		return err
	}

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	n.Etcd = n.newProcess("etcd", bin("etcd"),
		"--name=e2e", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=e2e=http://127.0.0.1:2380",
		"--unsafe-no-fsync", // a throwaway store: durability costs seconds here
		"--log-level=warn")
	if err := n.Etcd.Start(); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", nil, 30*time.Second); err != nil {
		return fmt.Errorf("etcd: %w\n%s", err, n.Etcd.Tail(20))
	}

	bind := "127.0.0.1"
	if len(n.Options.Workers) > 0 {
		// The workers reach it on NodeIP, the tests on loopback; every
		// address is inside the run's namespace.
		bind = "0.0.0.0"
	}
	n.APIServer = n.newProcess("kube-apiserver", bin("kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address="+bind, fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--advertise-address="+NodeIP,
		"--tls-cert-file="+p.ServingCert, "--tls-private-key-file="+p.ServingKey,
		"--token-auth-file="+tokenFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--admission-control-config-file="+admissionFile,
		"--service-account-issuer="+saIssuer,
		"--service-account-key-file="+p.SAPub,
		"--service-account-signing-key-file="+p.SAKey,
		"--service-cluster-ip-range="+serviceCIDR,
		"--endpoint-reconciler-type=none",
		"--kubelet-preferred-address-types=InternalIP",
		"--allow-privileged=true",
		"--runtime-config="+runtimeConfig,
		"--feature-gates="+gates,
		"--profiling=false")
	if err := n.APIServer.Start(); err != nil {
		return err
	}
	if err := n.waitAPIServer(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w\n%s", err, n.APIServer.Tail(30))
	}

	cmArgs := []string{"--kubeconfig=" + kc["controller-manager"],
		"--leader-elect=false", "--secure-port=0",
		"--root-ca-file=" + p.CACert,
		"--service-account-private-key-file=" + p.SAKey,
		"--use-service-account-credentials=false",
		"--flex-volume-plugin-dir=" + filepath.Join(n.Root, "cm-flexvolume"),
		"--feature-gates=" + gates,
		"--profiling=false"}
	schedArgs := []string{"--kubeconfig=" + kc["scheduler"],
		"--leader-elect=false", "--secure-port=0",
		"--feature-gates=" + gates,
		"--profiling=false"}
	switch {
	case len(n.Options.Workers) > 0:
		cmArgs = clusterControllerManagerArgs(cmArgs)
	case n.Options.ControlPlaneOnly:
		cmArgs = fleetControllerManagerArgs(cmArgs)
		if schedArgs, err = n.fleetSchedulerArgs(schedArgs, kc["scheduler"]); err != nil {
			return err
		}
	}
	schedBin := bin("kube-scheduler")
	if n.Options.SchedulerBinary != "" {
		schedBin = n.Options.SchedulerBinary
	}
	n.ControllerManager = n.newProcess("kube-controller-manager", bin("kube-controller-manager"), cmArgs...)
	n.Scheduler = n.newProcess("kube-scheduler", schedBin, schedArgs...)
	if err := n.ControllerManager.Start(); err != nil {
		return err
	}
	if n.Options.DeferScheduler {
		return nil
	}
	return n.Scheduler.Start()
}

// waitAPIServer polls /readyz with the admin credentials.
func (n *Node) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	cs, err := n.adminClient()
	if err != nil {
		return err
	}
	return waitfor.Check(ctx, "kube-apiserver ready", timeout, func() error {
		if !n.APIServer.Running() {
			return waitfor.Stop(fmt.Errorf("exited: %v", n.APIServer.ExitErr()))
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%v: %s", err, body)
		}
		return nil
	})
}

// waitHTTP polls url until it answers 200.
func waitHTTP(ctx context.Context, url string, client *http.Client, timeout time.Duration) error {
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	return waitfor.Check(ctx, url+" healthy", timeout, func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// RestartControlPlane restarts kube-apiserver, kube-controller-manager and
// kube-scheduler with gates changed over the node's (the kubelet keeps
// its own), as an upgrade or a change of the cluster's feature gates does:
// etcd keeps every object. It returns once the API server is ready again.
func (n *Node) RestartControlPlane(ctx context.Context, gates map[string]bool) error {
	for k, v := range gates {
		n.Options.FeatureGates[k] = v
	}
	flag := "--feature-gates=" + gateFlag(n.Options.FeatureGates)
	procs := []*Process{n.Scheduler, n.ControllerManager, n.APIServer}
	for _, p := range procs {
		p.Stop(10 * time.Second)
		for i, a := range p.Args {
			if strings.HasPrefix(a, "--feature-gates=") {
				p.Args[i] = flag
			}
		}
	}
	if err := n.APIServer.Start(); err != nil {
		return err
	}
	if err := n.waitAPIServer(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w\n%s", err, n.APIServer.Tail(30))
	}
	for _, p := range []*Process{n.ControllerManager, n.Scheduler} {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}
