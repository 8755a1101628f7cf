package config

import configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"

// GPUPolicy is the validated gpus section: what the GPU driver publishes.
// The zero policy publishes everything the hardware delivers.
type GPUPolicy struct {
	migProfiles *configv1alpha1.ProfileFilter
}

// GPUPolicy returns the validated GPU policy.
func (c *AgentConfig) GPUPolicy() GPUPolicy { return c.gpu }

// OffersMIGProfile reports whether the MIG profile of that name
// ("1g.10gb+me") is published.
func (p GPUPolicy) OffersMIGProfile(name string) bool { return p.migProfiles.Offers(name) }

func gpuPolicy(g *configv1alpha1.GPUConfig) GPUPolicy {
	if g == nil {
		return GPUPolicy{}
	}
	return GPUPolicy{migProfiles: g.MIGProfiles.DeepCopy()}
}
