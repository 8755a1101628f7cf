// Package api decodes the opaque device configuration of hwdra's drivers
// (DeviceClass and ResourceClaim config.opaque.parameters) strictly into
// its versioned types.
package api

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
)

// Config is a decoded configuration type.
type Config interface {
	runtime.Object
	Default()
	Validate() field.ErrorList
}

var (
	scheme  = runtime.NewScheme()
	decoder runtime.Decoder
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{gpuv1alpha1.AddToScheme, sriovv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	// Strict: unknown and duplicate fields are errors, not silently lost.
	decoder = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
		json.SerializerOptions{Yaml: false, Pretty: false, Strict: true})
}

// Decode decodes one parameters object, defaults and validates it.
func Decode(raw []byte) (Config, error) {
	obj, _, err := decoder.Decode(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	c, ok := obj.(Config)
	if !ok {
		return nil, fmt.Errorf("%T is not a configuration type", obj)
	}
	c.Default()
	if errs := c.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return c, nil
}

// ForRequest returns the configuration of type T that applies to one
// request of an allocated claim, or the zero T (defaulted) when none does.
// Configurations come from the DeviceClass first and the claim second;
// among those naming the driver and the request (or all requests) the
// last wins, so a claim overrides its class. Errors name the request,
// where the configuration came from and the field (the caller names the
// claim).
func ForRequest[T Config](claim *resourceapi.ResourceClaim, driver, request string, zero T) (T, error) {
	chosen := zero
	chosen.Default()
	if claim.Status.Allocation == nil {
		return chosen, nil
	}
	base, _, _ := strings.Cut(request, "/") // a subrequest's configs name its parent
	for i, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, base) {
			continue
		}
		where := fmt.Sprintf("request %q, config[%d] from %s", request, i, sourceName(c.Source))
		decoded, err := Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			return zero, fmt.Errorf("%s: %w", where, err)
		}
		typed, ok := decoded.(T)
		if !ok {
			return zero, fmt.Errorf("%s: %s is not a configuration for %s", where, decoded.GetObjectKind().GroupVersionKind().Kind, driver)
		}
		chosen = typed
	}
	return chosen, nil
}

func sourceName(s resourceapi.AllocationConfigSource) string {
	if s == resourceapi.AllocationConfigSourceClass {
		return "the DeviceClass"
	}
	return "the claim"
}
