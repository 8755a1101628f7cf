// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nvml is the GPU backend on NVIDIA's NVML (github.com/NVIDIA/go-nvml):
// it reads the node's GPUs, their MIG and vGPU capabilities and state into
// hw types. The same code runs on the real libnvidia-ml and on mock's
// mock of it.
package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoNVML is wrapped by every error that means NVML cannot be used here:
// Init failed, or was never called.
var ErrNoNVML = errors.New("no NVML: libnvidia-ml.so.1 not found; is the NVIDIA driver installed?")

// Backend reads GPUs through an nvml.Interface.
//
// Hardware quirk: after a failed nvmlInit, any other NVML call kills the
// process (the library's symbols are unresolved: a dynamic-linker abort,
// not a Go panic). Every method therefore checks that Init succeeded
// before it touches the library, and Shutdown waits for calls in flight
// (after the last Shutdown go-nvml unloads the library).
type Backend struct {
	lib   nvml.Interface
	sysfs string

	mu          sync.RWMutex // held for reading by every call into lib
	initialized bool
	symbols     sync.Map // symbol name -> bool: present in the loaded library
}

// Option configures a Backend.
type Option func(*Backend)

// WithSysfs sets the sysfs root (default "/sys"), read for each GPU's PCIe
// root and, when NVML cannot tell, its NUMA node.
func WithSysfs(root string) Option {
	return func(b *Backend) { b.sysfs = root }
}

// New returns a Backend on lib; nil means the system's libnvidia-ml.so.1.
// It does not touch the library until Init.
func New(lib nvml.Interface, opts ...Option) *Backend {
	if lib == nil {
		lib = nvml.New()
	}
	b := &Backend{lib: lib, sysfs: "/sys"}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Library is the NVML library of an initialised backend, for code that
// drives NVML itself (NVIDIA's nvcdi, which generates the driver's
// container edits: it initialises and shuts NVML down around its calls,
// which NVML counts); nil before a successful Init, so that nothing calls
// into a library that failed to load.
func (b *Backend) Library() nvml.Interface {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.initialized {
		return nil
	}
	return b.lib
}

// Init initialises NVML. On failure the error wraps ErrNoNVML and no other
// NVML function is called, by this or any later method. Calling Init again
// after a success does nothing.
func (b *Backend) Init() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.initialized {
		return nil
	}
	ret, panicked := safeInit(b.lib)
	switch {
	case panicked != nil:
		// Some go-nvml versions panic instead of returning
		// ERROR_LIBRARY_NOT_FOUND when the library cannot be loaded.
		return fmt.Errorf("NVML Init panicked (%v): %w", panicked, ErrNoNVML)
	case ret == nvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrNoNVML
	case ret != nvml.SUCCESS:
		return fmt.Errorf("NVML Init: %v: %w", ret, ErrNoNVML)
	}
	b.initialized = true
	return nil
}

func safeInit(lib nvml.Interface) (ret nvml.Return, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	return lib.Init(), nil
}

// Shutdown releases NVML after a successful Init; otherwise it does
// nothing (and calls nothing).
func (b *Backend) Shutdown() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.initialized {
		return nil
	}
	b.initialized = false
	b.symbols.Clear()
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML Shutdown: %w", ret)
	}
	return nil
}

// ready reports whether lib may be called; the caller holds b.mu.
func (b *Backend) ready() error {
	if !b.initialized {
		return fmt.Errorf("NVML not initialised: %w", ErrNoNVML)
	}
	return nil
}

// deviceCount is the number of GPUs, under the Init gate; the caller
// holds b.mu.
func (b *Backend) deviceCount() (int, error) {
	if err := b.ready(); err != nil {
		return 0, err
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("DeviceGetCount: %w", ret)
	}
	return count, nil
}

// has reports whether the loaded library exports a symbol. Hardware quirk:
// go-nvml binds C functions lazily, so calling one that an older driver's
// libnvidia-ml lacks kills the process like a call after a failed Init.
// Functions newer than MIG itself (R450) are looked up before use; a
// missing one counts as ERROR_NOT_SUPPORTED.
func (b *Backend) has(symbol string) bool {
	if v, ok := b.symbols.Load(symbol); ok {
		return v.(bool)
	}
	ok := b.lib.Extensions().LookupSymbol(symbol) == nil
	b.symbols.Store(symbol, ok)
	return ok
}

// nvmlPkg is go-nvml's package path: devices of a type declared there are
// the real library's, anything else is a mock.
var nvmlPkg = reflect.TypeOf(nvml.SUCCESS).PkgPath()

func isLibraryDevice(dev nvml.Device) bool {
	t := reflect.TypeOf(dev)
	return t != nil && t.PkgPath() == nvmlPkg
}
