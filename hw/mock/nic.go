package mock

// NICGroup is Count identical SR-IOV NICs (one PF each).
// (Filled in by the SR-IOV work.)
type NICGroup struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

func (g NICGroup) validate() error { return nil }

// buildNICs creates the NICs' sysfs tree (and, as root, their netdevs).
func (h *Hardware) buildNICs() error { return nil }

// closeNICs removes what buildNICs created outside h.dir.
func (h *Hardware) closeNICs() error { return nil }
