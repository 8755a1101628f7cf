package agent

import "github.com/hwdra/hwdra/hw"

// health is what the monitors found wrong now.
func (p *publisher) health() hw.Health {
	if p.faults == nil {
		return hw.Health{}
	}
	return p.faults()
}
