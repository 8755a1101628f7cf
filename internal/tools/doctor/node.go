// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
)

// The NICs, and the node's folders and sockets the agent uses.

// sriov: the SR-IOV PFs, their VFs and which the configuration offers; a
// shared PF's VFs bound to no network driver are no shares, and a PF
// whose link is down is published tainted.
func (r *run) sriov(context.Context) Check {
	c := Check{ID: "sriov"}
	if r.pfsErr != nil {
		c.Details = append(c.Details, "error: "+r.pfsErr.Error())
	}
	if len(r.pfs) == 0 {
		c.Status, c.Summary = OK, "no SR-IOV PF on this node"
		if r.pfsErr != nil {
			c.Status, c.Summary = Warn, "cannot read the NICs: "+r.pfsErr.Error()
			c.Fix = "run on the node with its /sys, as root"
		}
		return c
	}
	offered := map[string]config.Mode{}
	for _, o := range r.offers {
		offered[o.PF.PCIAddress] = o.Mode
	}
	skipped := map[string]string{}
	for _, s := range r.skips {
		skipped[s.PCIAddress] = s.Reason
	}
	vfs := 0
	var noDriver, down []string
	for _, pf := range r.pfs {
		vfs += len(pf.VFs)
		netVFs := 0
		for _, vf := range pf.VFs {
			if vf.NetdevDriver() {
				netVFs++
			}
		}
		link := "link down"
		if pf.LinkUp {
			link = fmt.Sprintf("link up, %d Mb/s", pf.SpeedMbps)
		}
		d := fmt.Sprintf("%s %s (%s, %s): %s, %d on a network driver; ", pf.PCIAddress, or(pf.Netdev, "no netdev"), or(pf.Driver, "no driver"), link,
			plural(len(pf.VFs), "VF", "VFs"), netVFs)
		mode, ok := offered[pf.PCIAddress]
		if !ok {
			c.Details = append(c.Details, d+"not offered: "+skipped[pf.PCIAddress])
			continue
		}
		c.Details = append(c.Details, d+"offered "+string(mode))
		if mode == config.ModeShared && netVFs < len(pf.VFs) {
			noDriver = append(noDriver, fmt.Sprintf("%s (%d of %d)", pf.PCIAddress, len(pf.VFs)-netVFs, len(pf.VFs)))
		}
		if !pf.LinkUp {
			down = append(down, pf.PCIAddress)
		}
	}
	c.Status = OK
	c.Summary = fmt.Sprintf("%s with %s; %d offered, %d not", plural(len(r.pfs), "PF", "PFs"), plural(vfs, "VF", "VFs"), len(r.offers), len(r.skips))
	var fixes []string
	if len(noDriver) > 0 {
		c.Status = Warn
		c.Summary += "; VFs bound to no network driver are not offered as shares: " + strings.Join(noDriver, ", ")
		fixes = append(fixes, "bind those VFs to the NIC's network driver (or offer the PF in exclusive mode, nics[].mode: exclusive, to hand VFs out whole)")
	}
	if len(down) > 0 {
		c.Status = Warn
		c.Summary += "; link down on " + strings.Join(down, ", ") + ": their devices are published tainted"
		fixes = append(fixes, "check the cable and the switch port")
	}
	if r.pfsErr != nil {
		c.Status = Warn
		fixes = append(fixes, "some devices could not be read (see the error)")
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

// nri: the container runtime's NRI socket, through which VFs reach pods.
func (r *run) nri(context.Context) Check {
	c := Check{ID: "nri"}
	path := r.in.Paths.NRISocket
	needed := len(r.offers) > 0
	const fix = "turn NRI on in the container runtime (containerd 2.x has it on: [plugins.'io.containerd.nri.v1.nri'] disable = false), or give its socket with --nri-socket (chart: nriSocket)"
	if path == "" {
		c.Status, c.Summary = OK, "NRI off (--nri-socket empty), and no PF offered needs it"
		if needed {
			c.Status, c.Summary = Warn, "NRI off (--nri-socket empty): VFs stay in the node's network namespace, pods with VF claims get no interface"
			c.Fix = fix
		}
		return c
	}
	st, err := os.Stat(path)
	switch {
	case err == nil && st.Mode().Type() == fs.ModeSocket:
		c.Status, c.Summary = OK, "the runtime's NRI socket "+path
		return c
	case err == nil:
		c.Summary = path + " is not a socket"
	case errors.Is(err, fs.ErrNotExist):
		c.Summary = "no NRI socket at " + path
	default:
		c.Summary = path + ": " + err.Error()
	}
	if !needed {
		c.Status = OK
		c.Summary += ", and no PF offered needs it"
		return c
	}
	c.Status = Warn
	c.Summary += ": the agent refuses NIC claims until it connects, and pods with VF claims get no interface"
	c.Fix = fix
	return c
}

// kubeletDirs: the kubelet's plugin registry, without which the agent
// does not start, and its plugins folder.
func (r *run) kubeletDirs(context.Context) Check {
	c := Check{ID: "kubelet-dirs"}
	reg, plugins := r.in.Paths.RegistrarDir, r.in.Paths.PluginsDir
	c.Status = OK
	c.Summary = "the kubelet's plugin registry " + reg + " and plugins folder " + plugins
	if why := notDir(reg); why != "" {
		c.Status = Blocker
		c.Summary = fmt.Sprintf("the kubelet's plugin registry --kubelet-registrar-dir %s: %s: the agent does not start", reg, why)
		c.Fix = "run on a node whose kubelet runs, and give its folders: --kubelet-registrar-dir and --kubelet-plugins-dir under the kubelet's --root-dir (chart: kubeletRootDir)"
	}
	if why := notDir(plugins); why != "" {
		c.Details = append(c.Details, fmt.Sprintf("--kubelet-plugins-dir %s: %s (the agent makes it, but the kubelet makes it too: is it the kubelet's?)", plugins, why))
		if c.Status == OK {
			c.Status = Warn
			c.Summary = fmt.Sprintf("the kubelet's plugins folder %s: %s: the agent makes it, but the kubelet's would be there", plugins, why)
			c.Fix = "give the kubelet's: --kubelet-plugins-dir under its --root-dir (chart: kubeletRootDir)"
		}
	}
	return c
}

// notDir says why path is no folder; "" where it is one.
func notDir(path string) string {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "no such folder"
	case errors.Is(err, unix.ENOTDIR):
		return "a part of it is a file"
	case err != nil:
		return err.Error()
	case !st.IsDir():
		return "not a folder"
	}
	return ""
}

// writableDir says why the agent could not make or write into dir; ""
// where it can. Nothing is made: the nearest folder that exists must
// take writes.
func writableDir(dir string) string {
	for p := dir; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		switch {
		case (errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)) && p != filepath.Dir(p):
			continue
		case err != nil:
			return err.Error()
		case !st.IsDir():
			return p + " is a file, not a folder"
		}
		if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
			return fmt.Sprintf("%s does not take writes: %v", p, err)
		}
		return ""
	}
}

// cdiDir: the runtime's CDI folder, where the agent writes each claim's
// spec: there or to be made, and writable. The toolkit's spec folders
// are listed.
func (r *run) cdiDir(context.Context) Check {
	c := Check{ID: "cdi-dir"}
	dir := r.in.Paths.CDIDir
	for _, d := range driverlibs.SpecDirs(r.in.Node.DriverSpecDirs, dir) {
		state := "there"
		if why := notDir(d); why != "" {
			state = why
		}
		c.Details = append(c.Details, "CDI spec folder "+d+": "+state)
	}
	if why := writableDir(dir); why != "" {
		c.Status = Blocker
		c.Summary = fmt.Sprintf("--cdi-dir %s: %s: the agent does not start", dir, why)
		c.Fix = "give the container runtime's CDI folder (containerd's and CRI-O's cdi_spec_dirs; chart: cdiDir), writable by the agent"
		return c
	}
	c.Status = OK
	c.Summary = "--cdi-dir " + dir + " takes the claims' specs"
	if notDir(dir) != "" {
		c.Summary += " (the agent makes it)"
	}
	c.Summary += "; the container runtime must read it (its cdi_spec_dirs)"
	return c
}

// stateDir: the agent's state folder: there or to be made, writable; a
// state file set aside as unreadable is said.
func (r *run) stateDir(context.Context) Check {
	c := Check{ID: "state-dir"}
	dir := r.in.Paths.StateDir
	if why := writableDir(dir); why != "" {
		c.Status = Blocker
		c.Summary = fmt.Sprintf("--state-dir %s: %s: the agent does not start", dir, why)
		c.Fix = "give a folder of the node that outlives the agent's pod and that it may write (chart: stateDir)"
		return c
	}
	c.Status = OK
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Summary = "--state-dir " + dir + ": none yet (the agent makes it)"
		return c
	case err != nil:
		c.Status, c.Summary = Warn, "--state-dir "+dir+": "+err.Error()
		c.Fix = "the agent must read its state folder: check its permissions"
		return c
	}
	var corrupt []string
	files := 0
	for _, e := range entries {
		switch {
		case strings.Contains(e.Name(), ".corrupt-"):
			corrupt = append(corrupt, e.Name())
		case strings.HasSuffix(e.Name(), ".json"):
			files++
		}
	}
	c.Summary = fmt.Sprintf("--state-dir %s: %s", dir, plural(files, "state file", "state files"))
	if len(corrupt) > 0 {
		c.Status = Warn
		c.Summary += fmt.Sprintf("; %s set aside as unreadable: %s", plural(len(corrupt), "file", "files"), strings.Join(corrupt, ", "))
		c.Fix = "the agent started without them and rebuilt what it could (prepared claims from their CDI specs); keep them for a bug report, then remove them"
	}
	return c
}
