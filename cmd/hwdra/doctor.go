// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/tools/doctor"
)

func doctorCommand() *cobra.Command {
	var (
		in                           doctor.Input
		root                         backend.DriverRoot
		hardware, configPath, output string
		kubeconfig                   string
		details                      bool
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check a node before (or instead of) deploying: what the agent would find and what blocks it, each finding with its fix; exits non-zero on a blocker",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			cmd.SilenceUsage = true // a blocker is no usage error
			if in.NodeName == "" {
				in.NodeName = os.Getenv("NODE_NAME")
			}
			if in.NodeName == "" {
				in.NodeName, _ = os.Hostname()
			}
			cfg, err := config.Load(configPath)
			if err != nil {
				return err
			}
			in.Config = cfg
			node, err := backend.OpenWith(hardware, backend.Options{DriverRoot: root, Logger: logr.Discard()})
			if err != nil {
				return err
			}
			defer node.Close()
			in.Node = node
			in.API = apiClient(kubeconfig)
			rep := doctor.Run(cmd.Context(), in)
			w := cmd.OutOrStdout()
			if output == "json" {
				out, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(w, "%s\n", out)
				if err != nil {
					return err
				}
			} else if err := rep.WriteText(w, details); err != nil {
				return err
			}
			if n := rep.Count(doctor.Blocker); n > 0 {
				var ids []string
				for _, c := range rep.Checks {
					if c.Status == doctor.Blocker {
						ids = append(ids, c.ID)
					}
				}
				return fmt.Errorf("%d blocker(s): %s", n, strings.Join(ids, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	addHardwareFlag(cmd, &hardware)
	addDriverRootFlags(cmd, &root)
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	f.BoolVar(&details, "details", false, "text output: the details of every check, not only of those that are not OK")
	f.StringVar(&configPath, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG, ~/.kube/config, or the pod's service account (in-cluster); none found: the API checks are skipped")
	f.StringVar(&in.NodeName, "node-name", in.NodeName, "the node's name, in the dry-run ResourceSlice of the DRA feature check; empty: $NODE_NAME, else the host name")
	f.StringVar(&in.CDIHook, "nvidia-cdi-hook", "", "nvidia-cdi-hook on the node, as the agent's flag; empty: the one shipped beside hwdra, or the one an agent installed into --state-dir/bin")
	addNodePathFlags(f, nodePaths{&in.Paths.RegistrarDir, &in.Paths.PluginsDir, &in.Paths.CDIDir, &in.Paths.StateDir, &in.Paths.NRISocket}, " (as the agent's flag)")
	return cmd
}

// apiClient is the API server as the agent finds it; none (and why) where
// no kubeconfig is found or it cannot be used.
func apiClient(kubeconfig string) doctor.API {
	rc, source, err := kubeConfig(kubeconfig)
	if err != nil {
		if errors.Is(err, errNoKubeConfig) {
			return doctor.API{}
		}
		return doctor.API{Err: err}
	}
	rc.UserAgent = "hwdra-doctor"
	rc.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return doctor.API{Err: err}
	}
	return doctor.API{Client: client, Server: rc.Host + " (" + source + ")"}
}
