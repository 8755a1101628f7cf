// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent"
	"github.com/hwdra/hwdra/internal/agent/mps"
)

func agentCommand() *cobra.Command {
	opts := agent.Options{NodeName: os.Getenv("NODE_NAME"), PodUID: os.Getenv("POD_UID")}
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: publish devices and prepare claims for the kubelet",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.NodeName == "" {
				return fmt.Errorf("--node-name (or NODE_NAME) is required")
			}
			if !opts.MPSCgroup.Valid() {
				return fmt.Errorf("--mps-daemon-cgroup: %q is none of \"\", %q and an absolute cgroup path", opts.MPSCgroup, mps.CgroupBesidePod)
			}
			if opts.KubeAPIQPS <= 0 || opts.KubeAPIBurst < 1 {
				return fmt.Errorf("--kube-api-qps must be above 0 and --kube-api-burst at least 1 (have %v and %d)", opts.KubeAPIQPS, opts.KubeAPIBurst)
			}
			rc, source, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			if err := makeDirs(cmd.Flags(), "state-dir", "cdi-dir", "kubelet-plugins-dir"); err != nil {
				return err
			}
			if err := needDirs(cmd.Flags(), "kubelet-registrar-dir"); err != nil {
				return err
			}
			rc.UserAgent = "hwdra-agent/" + opts.NodeName
			opts.KubeConfig, opts.KubeConfigSource = rc, source
			v, commit := buildVersion()
			klog.InfoS("Starting the hwdra agent", "version", v, "commit", commit, "node", opts.NodeName, "pod", opts.PodUID, "hardware", opts.Hardware,
				"apiServer", rc.Host, "kubeconfig", source)
			return agent.Run(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.NodeName, "node-name", opts.NodeName, "name of this Node (default $NODE_NAME)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, or the pod's service account (in-cluster)")
	f.Float32Var(&opts.KubeAPIQPS, "kube-api-qps", 50, "queries per second to the API server, for each of the agent's three clients (claims for prepare; ResourceSlice publishing; claim status writes)")
	f.IntVar(&opts.KubeAPIBurst, "kube-api-burst", 100, "burst of queries to the API server, for each of the agent's three clients")
	addHardwareFlag(cmd, &opts.Hardware)
	addDriverRootFlags(cmd, &opts.DriverRoot)
	f.StringVar(&opts.CDIHook, "nvidia-cdi-hook", "", "nvidia-cdi-hook on the node, which the container runtime runs for the driver files the agent generates for containers (an installed NVIDIA Container Toolkit's); empty: the one the agent's image ships, installed into --state-dir/bin")
	f.StringVar(&opts.PodUID, "pod-uid", opts.PodUID, "the agent's pod UID (default $POD_UID; the DaemonSet sets it): its kubelet plugins then register for rolling updates, beside an older pod's")
	f.StringVar(&opts.ConfigPath, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults")
	addNodePathFlags(f, nodePaths{&opts.RegistrarDir, &opts.PluginsDir, &opts.CDIDir, &opts.StateDir, &opts.NRISocket}, "")
	f.DurationVar(&opts.Rescan, "rescan-interval", time.Minute, "how often to probe the hardware for changes")
	f.DurationVar(&opts.FeatureCheck, "feature-check-interval", 10*time.Minute, "how often to check which DRA feature gates the API server has on (one dry-run ResourceSlice create each, also at start): a gate turned off makes the agent publish a model without it")
	f.StringVar(&opts.MetricsAddress, "metrics-address", ":9464", "address for /metrics (Prometheus), /healthz and /readyz; empty: off")
	f.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", "", "IP address to serve --metrics-address's port on (the node's IP; the chart passes status.hostIP); empty: --metrics-address's host, every interface if it names none")
	f.StringVar(&opts.DevicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory (fixed in the kubelet, whatever its --root-dir): while NVIDIA's device plugin has a socket there, or the node advertises its resources, the agent leaves the GPUs to it; empty: only the node's status is watched")
	f.IntVar(&opts.ClaimLimitGPUs, "claim-limit-gpus-per-node", 0, "the most whole GPUs the chart's claim-limits admission policy lets a claim ask for (claimLimits.gpusPerNode; 0: no policy): a node with more GPUs warns in /readyz, its log and an Event, since claims it could satisfy are refused")
	f.StringVar((*string)(&opts.MPSCgroup), "mps-daemon-cgroup", string(mps.CgroupSame),
		`where the MPS control daemons of shared GPUs run: "" in the agent's cgroup (an agent run as a process: they outlive it in sessions of their own), "`+string(mps.CgroupBesidePod)+`" in a cgroup of its own beside the agent's pod, which the runtime and the kubelet leave alone when the pod goes (the DaemonSet, with hostPID), or a cgroup path ("/hwdra-mps.slice") under which each gets a cgroup of its own; a daemon's own cgroup has its memory limited (gpus.mps.daemonMemoryLimit)`)
	return cmd
}
