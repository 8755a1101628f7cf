package gpusim

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/mock/persist"
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
	g.driver.unloaded.Store(!loaded)
	g.rep.Changed(persist.CallLoadDriver, "", true)
	return nil
}

// DriverLoaded reports whether the mock's NVIDIA driver is loaded.
func (g *GPUs) DriverLoaded() bool { return g.driver != nil && !g.driver.unloaded.Load() }
