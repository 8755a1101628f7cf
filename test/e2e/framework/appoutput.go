// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// AppOutput is the test app's log, parsed (see images/testapp).
type AppOutput struct {
	Env     map[string]string
	Files   map[string]string // path -> contents
	Devices map[string]string // path -> "char 195:0"
	Dirs    []string
	Missing map[string]string // path -> error
	// Interfaces are the container's network interfaces, by name.
	Interfaces map[string]Interface
	Ended      bool // the app printed everything it was asked for
}

// Interface is a network interface as the container sees it.
type Interface struct {
	Name  string
	MTU   int
	MAC   string
	Up    bool
	Addrs []string // CIDR form
}

// ParseAppOutput parses the test app's output.
func ParseAppOutput(log string) AppOutput {
	out := AppOutput{Env: map[string]string{}, Files: map[string]string{}, Devices: map[string]string{}, Missing: map[string]string{},
		Interfaces: map[string]Interface{}}
	var section, file string
	var body strings.Builder
	flush := func() {
		if section == "FILE" {
			out.Files[file] = body.String()
		}
		body.Reset()
	}
	s := bufio.NewScanner(strings.NewReader(log))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if rest, ok := strings.CutPrefix(line, "=== "); ok {
			flush()
			kind, arg, _ := strings.Cut(rest, " ")
			section = kind
			switch kind {
			case "FILE":
				file = arg
			case "DIR":
				out.Dirs = append(out.Dirs, arg)
			case "DEV":
				path, dev, _ := strings.Cut(arg, " ")
				out.Devices[path] = dev
			case "MISSING":
				path, err, _ := strings.Cut(arg, ": ")
				out.Missing[path] = err
			case "NET":
				if i, ok := parseInterface(arg); ok {
					out.Interfaces[i.Name] = i
				}
			case "END":
				out.Ended = true
			}
			continue
		}
		switch section {
		case "ENV":
			if k, v, ok := strings.Cut(line, "="); ok {
				out.Env[k] = v
			}
		case "FILE":
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	flush()
	return out
}

// parseInterface reads "<name> mtu=1500 mac=02:.. up=true addrs=a,b".
func parseInterface(s string) (Interface, bool) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return Interface{}, false
	}
	i := Interface{Name: fields[0]}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "mtu":
			i.MTU, _ = strconv.Atoi(v)
		case "mac":
			i.MAC = v
		case "up":
			i.Up = v == "true"
		case "addrs":
			if v != "" {
				i.Addrs = strings.Split(v, ",")
			}
		}
	}
	return i, true
}

// MetadataPath is where KEP-5304 puts a driver's device metadata for a pod
// claim made from a template: the library bind-mounts it there.
func MetadataPath(podClaim, request, driver string) string {
	return fmt.Sprintf("/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/%s/%s/%s-metadata.json", podClaim, request, driver)
}

// MetadataPathDirect is where KEP-5304 puts a driver's device metadata
// for a directly referenced claim.
func MetadataPathDirect(claim, request, driver string) string {
	return fmt.Sprintf("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/%s/%s/%s-metadata.json", claim, request, driver)
}

// DeviceMetadata is the part of a KEP-5304 metadata document tests check.
type DeviceMetadata struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Requests []struct {
		Name    string `json:"name"`
		Devices []struct {
			Driver      string                    `json:"driver"`
			Pool        string                    `json:"pool"`
			Name        string                    `json:"name"`
			Attributes  map[string]map[string]any `json:"attributes"`
			NetworkData *struct {
				InterfaceName   string   `json:"interfaceName"`
				IPs             []string `json:"ips"`
				HardwareAddress string   `json:"hardwareAddress"`
			} `json:"networkData"`
		} `json:"devices"`
	} `json:"requests"`
}

// DecodeMetadata decodes every document of a metadata file (one per API
// version the driver writes, newest first).
func DecodeMetadata(data string) ([]DeviceMetadata, error) {
	dec := json.NewDecoder(strings.NewReader(data))
	var docs []DeviceMetadata
	for dec.More() {
		var m DeviceMetadata
		if err := dec.Decode(&m); err != nil {
			return docs, err
		}
		docs = append(docs, m)
	}
	return docs, nil
}
