// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CharDevice is a character device node a container needs for a VF: its
// path relative to /dev and the numbers the kernel publishes for it in
// sysfs (<class dir>/dev, "231:192"), so a CDI spec can name it fully and
// no runtime has to stat a host node.
type CharDevice struct {
	Path         string // "infiniband/uverbs3", "vfio/42", "vfio/vfio"
	Major, Minor int64
	// NoIOMMU: a VFIO group of a kernel that runs VFIO without an IOMMU
	// (vfio/noiommu-<group>): nothing confines the device's DMA.
	NoIOMMU bool
}

// Uverbs returns the RDMA device of a PCI function ("mlx5_3") and its
// verbs node (/dev/infiniband/uverbs<n>), or "" and nil when the function
// has no RDMA device. The uverbs class device hangs off the RDMA device's
// parent: <dev>/infiniband_verbs/uverbs<n> before kernel 5.11, under the
// auxiliary device since mlx5 and ice moved RDMA there
// (<dev>/mlx5_core.rdma.<id>/infiniband_verbs/uverbs<n>). Its ibdev file
// names the RDMA device it serves.
func Uverbs(sysfsRoot, pciAddress string) (string, *CharDevice, error) {
	d := newDevice(rootOrDefault(sysfsRoot), pciAddress)
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return "", nil, d.err(".", unwrapPath(err))
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	rdma, err := rdmaDevice(d, names)
	if err != nil || rdma == "" {
		return "", nil, err
	}
	for _, e := range names {
		if e != "infiniband_verbs" && !isAuxDevice(e) {
			continue
		}
		dir := "infiniband_verbs"
		if e != dir {
			dir = filepath.Join(e, dir)
		}
		nodes, err := d.list(dir)
		if err != nil {
			return "", nil, err
		}
		for _, n := range nodes {
			if ib, err := d.read(filepath.Join(dir, n, "ibdev")); err != nil || ib != rdma {
				continue
			}
			major, minor, err := readDevNumbers(d, filepath.Join(dir, n, "dev"))
			if err != nil {
				return "", nil, err
			}
			return rdma, &CharDevice{Path: "infiniband/" + n, Major: major, Minor: minor}, nil
		}
	}
	// An RDMA device without a verbs node: ib_uverbs is not loaded.
	return rdma, nil, d.err(".", fmt.Errorf("RDMA device %s has no uverbs node (is ib_uverbs loaded?)", rdma))
}

// VFIOGroup returns the VFIO group node of a function bound to vfio-pci,
// /dev/vfio/<IOMMU group> (/dev/vfio/noiommu-<group> when the kernel runs
// VFIO without an IOMMU).
func VFIOGroup(sysfsRoot, pciAddress string) (CharDevice, error) {
	root := rootOrDefault(sysfsRoot)
	d := newDevice(root, pciAddress)
	target, err := d.readlink("iommu_group")
	if err != nil {
		return CharDevice{}, err
	}
	group := filepath.Base(target)
	for _, name := range []string{group, "noiommu-" + group} {
		dir := filepath.Join(root, "class", "vfio", name)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		major, minor, err := parseDevNumbers(filepath.Join(dir, "dev"))
		if err != nil {
			return CharDevice{}, d.err("iommu_group", err)
		}
		return CharDevice{Path: "vfio/" + name, Major: major, Minor: minor, NoIOMMU: name != group}, nil
	}
	return CharDevice{}, d.err("iommu_group", fmt.Errorf("IOMMU group %s has no VFIO group node (is the function bound to vfio-pci?)", group))
}

// MiscDevice returns a misc device's node from <root>/class/misc/<name>/dev,
// at path under /dev: "vfio" is vfio/vfio (10:196), "rdma_cm" is
// infiniband/rdma_cm (dynamic minor).
func MiscDevice(sysfsRoot, name, path string) (CharDevice, error) {
	major, minor, err := parseDevNumbers(filepath.Join(rootOrDefault(sysfsRoot), "class", "misc", name, "dev"))
	if err != nil {
		return CharDevice{}, fmt.Errorf("sriov: misc device %s: %w", name, err)
	}
	return CharDevice{Path: path, Major: major, Minor: minor}, nil
}

// FunctionState is what a PCI function is bound to now: its driver ("" if
// unbound) and its netdev ("" without one, or when the netdev is in
// another network namespace than the one that mounted sysfs: a VF moved
// into a pod).
func FunctionState(sysfsRoot, pciAddress string) (driver, netdev string, err error) {
	d := newDevice(rootOrDefault(sysfsRoot), pciAddress)
	if !d.exists(".") {
		return "", "", d.err(".", os.ErrNotExist)
	}
	var problems []error
	driver = readDriver(d, false, &problems)
	names, err := d.list("net")
	if err != nil {
		return driver, "", err
	}
	return driver, first(names), nil
}

func rootOrDefault(root string) string {
	if root == "" {
		return DefaultSysfsRoot
	}
	return root
}

func readDevNumbers(d device, file string) (int64, int64, error) {
	major, minor, err := parseDevNumbers(filepath.Join(d.dir, file))
	if err != nil {
		return 0, 0, d.err(file, unwrapPath(err))
	}
	return major, minor, nil
}

// parseDevNumbers reads a sysfs dev file: "<major>:<minor>".
func parseDevNumbers(path string) (int64, int64, error) {
	s, err := readAttr(path)
	if err != nil {
		return 0, 0, err
	}
	maj, min, ok := strings.Cut(s, ":")
	major, err1 := strconv.ParseInt(maj, 10, 64)
	minor, err2 := strconv.ParseInt(min, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%s: not <major>:<minor>: %q", path, s)
	}
	return major, minor, nil
}
