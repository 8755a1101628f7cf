package mock

import (
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// handlePrefixes are the handle types whose methods nvml.Interface also
// offers as functions: lib.DeviceGetUUID(dev) is dev.GetUUID(),
// lib.GpuInstanceDestroy(gi) is gi.Destroy().
var handlePrefixes = []string{"Device", "GpuInstance", "ComputeInstance", "VgpuType", "VgpuInstance", "EventSet", "GpmSample", "Unit"}

// forwardHandleFuncs makes the server answer the function form of every
// handle method the way the real library does, by calling the method on
// the handle; go-nvml's server leaves them unset (a panic). Functions the
// server already sets are kept.
func forwardHandleFuncs(s *server.Server) {
	v := reflect.ValueOf(&s.Interface).Elem()
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), strings.TrimSuffix(v.Type().Field(i).Name, "Func")
		ft := f.Type()
		if f.Kind() != reflect.Func || !f.IsNil() || ft.NumIn() == 0 || ft.In(0).Kind() != reflect.Interface {
			continue
		}
		for _, p := range handlePrefixes {
			method, ok := strings.CutPrefix(name, p)
			if !ok || method == "" {
				continue
			}
			if _, ok := ft.In(0).MethodByName(method); !ok {
				continue
			}
			f.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
				m := args[0].MethodByName(method)
				if ft.IsVariadic() {
					return m.CallSlice(args[1:])
				}
				return m.Call(args[1:])
			}))
			break
		}
	}
}
