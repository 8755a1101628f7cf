// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package driverlibs

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// generate has NVIDIA's nvcdi find the files of the driver under the root
// that a container needs: the libraries of the running driver's version
// (found by their version suffix, in the layouts' library folders or the
// root's ld cache), the driver's programs, the GSP firmware, and the hooks
// that make a soname link for each library and update the container's ld
// cache (the dynamic linker then finds them in any image), run by the
// container runtime from HookPath. Host paths come out as the runtime
// sees them (NodeRoot for Root).
//
// Left out on purpose: nvsandboxutils (a second library to load for
// nothing NVML does not tell), and the IPC sockets nvcdi would mount from
// the host (/tmp/nvidia-mps among them, which would cover an MPS claim's
// own pipe directory; nvidia-persistenced's socket is not needed by CUDA).
func (l *Libraries) generate(logger klog.Logger) (*cdispec.ContainerEdits, error) {
	opts := []nvcdi.Option{
		nvcdi.WithLogger(nvcdiLogger{logger.WithName("nvcdi")}),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(l.opts.NVML),
		nvcdi.WithDriverRoot(l.opts.Root),
		nvcdi.WithDevRoot(l.opts.DevRoot),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils, nvcdi.FeatureDisableIPCDiscoverer),
	}
	if l.opts.HookPath != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(l.opts.HookPath))
	} else {
		opts = append(opts, nvcdi.WithDisabledHooks(nvcdi.AllHooks))
	}
	lib, err := nvcdi.New(opts...)
	if err != nil {
		return nil, err
	}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return nil, err
	}
	if common == nil || common.ContainerEdits == nil {
		return nil, fmt.Errorf("no files found")
	}
	spec := &cdispec.Spec{ContainerEdits: *common.ContainerEdits}
	if node := l.nodeRoot(); node != l.opts.Root {
		if err := root.New(root.WithRoot(l.opts.Root), root.WithTargetRoot(node), root.WithRelativeTo("host")).Transform(spec); err != nil {
			return nil, err
		}
	}
	if !mountsLibrary(spec.ContainerEdits.Mounts, "libcuda.so.") {
		return nil, fmt.Errorf("no libcuda.so of the driver among the files found")
	}
	return &spec.ContainerEdits, nil
}

func (l *Libraries) nodeRoot() string {
	if l.opts.NodeRoot == "" {
		return l.opts.Root
	}
	return l.opts.NodeRoot
}

// mountsLibrary reports whether mounts bring a library whose file name
// starts with prefix.
func mountsLibrary(mounts []*cdispec.Mount, prefix string) bool {
	for _, m := range mounts {
		if strings.HasPrefix(filepath.Base(m.HostPath), prefix) {
			return true
		}
	}
	return false
}

// nvcdiLogger takes nvcdi's log lines into klog: its warnings are mostly
// about optional files a driver may lack (graphics libraries, firmware of
// other GPUs), so they go to V(2); its info lines to V(4).
type nvcdiLogger struct{ l klog.Logger }

func (n nvcdiLogger) Errorf(f string, args ...any)   { n.l.Error(nil, fmt.Sprintf(f, args...)) }
func (n nvcdiLogger) Warningf(f string, args ...any) { n.l.V(2).Info(fmt.Sprintf(f, args...)) }
func (n nvcdiLogger) Infof(f string, args ...any)    { n.l.V(4).Info(fmt.Sprintf(f, args...)) }
func (n nvcdiLogger) Debugf(f string, args ...any)   { n.l.V(5).Info(fmt.Sprintf(f, args...)) }
func (n nvcdiLogger) Tracef(f string, args ...any)   { n.l.V(6).Info(fmt.Sprintf(f, args...)) }
