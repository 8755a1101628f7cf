package gpu

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestQualifyPutsOwnAttributesInTheDriverDomain(t *testing.T) {
	s := "x"
	got := qualify(map[string]resourceapi.DeviceAttribute{
		"uuid": {StringValue: &s}, "resource.kubernetes.io/pciBusID": {StringValue: &s},
	})
	for _, want := range []string{"gpu.hwdra.io/uuid", "resource.kubernetes.io/pciBusID"} {
		if _, ok := got[want]; !ok {
			t.Errorf("missing %s in %v", want, got)
		}
	}
	if len(got) != 2 {
		t.Errorf("got %v", got)
	}
}
