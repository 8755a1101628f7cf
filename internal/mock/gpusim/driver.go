// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// driverGate is the NVIDIA kernel driver and libnvidia-ml being there or
// not, as on a node whose driver container is not ready yet: nvmlInit
// fails with ERROR_LIBRARY_NOT_FOUND, and any other call panics, standing
// in for the process death such a call causes on a real node. Loading the
// driver (GPUs.SetDriverLoaded) makes Init succeed from then on.
type driverGate struct {
	unloaded atomic.Bool
	// inits counts successful Inits not yet shut down: the driver cannot
	// be unloaded under them.
	inits atomic.Int64
}

// gateOnDriver wraps every library-level function of s (handle methods
// are reached only through them).
func gateOnDriver(s *server.Server) *driverGate {
	g := &driverGate{}
	v := reflect.ValueOf(&s.Interface).Elem()
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), strings.TrimSuffix(v.Type().Field(i).Name, "Func")
		if f.Kind() != reflect.Func || f.IsNil() {
			continue
		}
		switch name {
		case "Init", "InitWithFlags", "Shutdown":
			continue
		}
		orig := reflect.ValueOf(f.Interface())
		f.Set(reflect.MakeFunc(f.Type(), func(args []reflect.Value) []reflect.Value {
			if g.unloaded.Load() {
				panic(fmt.Sprintf("mock NVML: %s called while the NVIDIA driver is not loaded: on a real node this call kills the process (gate every NVML call on a successful Init)", name))
			}
			if orig.Type().IsVariadic() {
				return orig.CallSlice(args)
			}
			return orig.Call(args)
		}))
	}
	init := func() nvml.Return {
		if g.unloaded.Load() {
			return nvml.ERROR_LIBRARY_NOT_FOUND
		}
		g.inits.Add(1)
		return nvml.SUCCESS
	}
	s.InitFunc = init
	s.InitWithFlagsFunc = func(uint32) nvml.Return { return init() }
	s.ShutdownFunc = func() nvml.Return {
		if g.inits.Add(-1) < 0 {
			g.inits.Add(1)
			return nvml.ERROR_UNINITIALIZED
		}
		return nvml.SUCCESS
	}
	return g
}

// SetDriverLoaded loads or unloads the mock's NVIDIA driver. Unloading
// fails while a process has NVML initialised (the module is in use).
func (g *GPUs) SetDriverLoaded(loaded bool) error {
	if g.driver == nil {
		return errors.New("mock: the profile has no GPUs, so no NVIDIA driver")
	}
	if !loaded && g.driver.inits.Load() > 0 {
		return errors.New("mock: the NVIDIA driver is in use (NVML is initialised): it cannot be unloaded")
	}
	if g.driver.unloaded.Load() == !loaded {
		return nil
	}
	if err := g.loadModule(loaded); err != nil {
		return err
	}
	g.driver.unloaded.Store(!loaded)
	g.rep.Changed(persist.CallLoadDriver, "", true)
	return nil
}

// moduleVersionFile is where the loaded kernel module says its version,
// under the node's proc.
const moduleVersionFile = "driver/nvidia/version"

// loadModule writes the kernel module's version file as the loaded
// module shows it (the open kernel module's wording, of the driver
// version NVML reports), or removes it as unloading the module does.
func (g *GPUs) loadModule(loaded bool) error {
	if !loaded {
		if err := os.Remove(g.module); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeFile(g.module, fmt.Sprintf("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:26:52 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n", g.DriverVersion))
}

// DriverLoaded reports whether the mock's NVIDIA driver is loaded.
func (g *GPUs) DriverLoaded() bool { return g.driver != nil && !g.driver.unloaded.Load() }
