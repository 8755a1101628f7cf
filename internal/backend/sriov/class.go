// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// classIndex maps PCI addresses to the class devices (netdevs, RDMA
// devices) that hang off them, from one listing of /sys/class/<class> and
// one readlink per entry. Listing every VF's directory instead costs
// several syscalls per VF, which on a node with hundreds of VFs is most of
// discovery's time.
type classIndex map[string][]string

// scanClass reads <root>/class/<class>. Each entry links into the device
// tree: .../0000:17:00.2/net/enp23s0f0v0, or for RDMA devices since 5.11
// .../0000:17:00.2/mlx5_core.rdma.2/infiniband/mlx5_2 (an auxiliary device
// in between). Entries not on a PCI function (veth, bridges, SFs on an
// auxiliary device) are ignored. Only the netdevs of the network namespace
// that mounted sysfs are listed, as under the devices' own net/ dirs.
func scanClass(root, class string) (classIndex, error) {
	dir := filepath.Join(root, "class", class)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return classIndex{}, nil
		}
		return nil, err
	}
	idx := classIndex{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // a plain directory or gone meanwhile: not a device link
		}
		parts := strings.Split(filepath.ToSlash(target), "/")
		// parts: ... <pci address> [<aux device>] <class dir> <name>
		n := len(parts)
		if n < 3 {
			continue
		}
		parent := parts[n-3]
		if isAuxDevice(parent) && n >= 4 {
			parent = parts[n-4]
		}
		if isPCIAddress(parent) {
			idx[parent] = append(idx[parent], e.Name())
		}
	}
	for _, names := range idx {
		sort.Strings(names)
	}
	return idx, nil
}

// isAuxDevice: auxiliary bus device names are <module>.<name>.<id>.
func isAuxDevice(s string) bool { return strings.Count(s, ".") == 2 && !isPCIAddress(s) }

// isPCIAddress: "0000:17:00.2" (domains may have more digits, as VMD's).
func isPCIAddress(s string) bool {
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) < 4 || len(rest) != len("17:00.2") || rest[2] != ':' || rest[5] != '.' {
		return false
	}
	return isHex(dom) && isHex(rest[:2]) && isHex(rest[3:5]) && isHex(rest[6:])
}

func isHex(s string) bool {
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return s != ""
}
