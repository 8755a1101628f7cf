package mock

// NICGroup is Count identical SR-IOV NICs (one PF each).
// (Filled in by the SR-IOV work.)
type NICGroup struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

func (g NICGroup) validate() error { return nil }
