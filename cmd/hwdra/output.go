// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/backend"
)

func addHardwareFlag(cmd *cobra.Command, hardware *string) {
	cmd.Flags().StringVar(hardware, "hardware", backend.Host,
		`"host" for this machine's GPUs and NICs, or "mock:<profile>" (built-in name or YAML file)`)
}

// addDriverRootFlags: where the NVIDIA driver is (--hardware host).
func addDriverRootFlags(cmd *cobra.Command, root *backend.DriverRoot) {
	cmd.Flags().StringVar(&root.Path, "nvidia-driver-root", "",
		"the NVIDIA driver's root on the node: / for a driver installed on the host, /run/nvidia/driver for the GPU operator's driver container, /usr/local/nvidia or /home/kubernetes/bin/nvidia for the flat layout (bin/, lib64/); libnvidia-ml.so.1 and the driver's programs are found under it, and GPU device nodes under its dev/ if it has one; empty: the first of "+strings.Join(backend.KnownRoots, ", ")+" with NVML and the programs")
	cmd.Flags().StringVar(&root.Mount, "nvidia-driver-root-mount", "",
		"where this process sees --nvidia-driver-root (the DaemonSet mounts it at /driver-root); empty: the same path")
	cmd.Flags().StringVar(&root.Host, "host-root", "/",
		"where this process sees the node's / (the DaemonSet mounts only the known driver roots under /host, read-only): the known driver roots are looked for under it when --nvidia-driver-root is empty")
}

func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "yaml", "output format: yaml or json")
}

func printObject(w io.Writer, format string, v any) error {
	var (
		out []byte
		err error
	)
	switch format {
	case "yaml":
		out, err = yaml.Marshal(v)
	case "json":
		out, err = json.MarshalIndent(v, "", "  ")
		out = append(out, '\n')
	default:
		return fmt.Errorf("--output %q: want yaml or json", format)
	}
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// printList writes objects as a multi-document YAML stream, or as a JSON
// v1 List: both are what `kubectl apply -f -` takes.
func printList[T any](w io.Writer, format string, items []T) error {
	if format != "yaml" {
		return printObject(w, format, map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	}
	for _, item := range items {
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
		if err := printObject(w, format, item); err != nil {
			return err
		}
	}
	return nil
}
