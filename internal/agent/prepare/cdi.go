// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/state"
)

// EnvName is a container environment variable name of hwdra's:
// HWDRA_ and the parts, upper case, joined by "_", every character other
// than a letter or digit turned into "_" ("nic/fast", 0 -> NIC_FAST_0).
func EnvName(parts ...string) string {
	b := []byte("HWDRA_" + strings.ToUpper(strings.Join(parts, "_")))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// One CDI spec per claim, "<driver>_claim_<uid>.json", kind
// "<driver>/claim", one CDI device per prepared device named after the
// claim UID, so a runtime's cached spec of an earlier claim never matches.

func (p *Plugin[R]) specName(uid types.UID) string { return p.specPrefix() + string(uid) + ".json" }

func (p *Plugin[R]) specPrefix() string { return p.opts.DriverName + "_claim_" }

// writeSpec writes the claim's spec and fills in each device's CDI ID.
// The spec also holds the claim's entry as it will be checkpointed
// (prepared, with these devices), to rebuild the claim from should the
// checkpoint be lost.
func (p *Plugin[R]) writeSpec(uid types.UID, entry Claim[R], devices []Device) error {
	kind := p.opts.DriverName + "/claim"
	spec := &cdispec.Spec{Kind: kind}
	for i := range devices {
		d := &devices[i]
		if d.Edits == nil {
			continue
		}
		name := string(uid) + "-" + d.Device
		if d.ShareID != nil {
			name += "-" + string(*d.ShareID)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: *d.Edits})
		d.CDIDeviceIDs = []string{kind + "=" + name}
	}
	if len(spec.Devices) == 0 {
		return nil
	}
	entry.State, entry.Devices = StatePrepared, devices
	if err := p.annotate(spec, &entry); err != nil {
		return fmt.Errorf("CDI spec: %w", err)
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec: %w", err)
	}
	spec.Version = version
	if err := p.cdi.WriteSpec(spec, p.specName(uid)); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	return nil
}

func (p *Plugin[R]) removeSpec(uid types.UID) error {
	return p.cdi.RemoveSpec(p.specName(uid))
}

// claimSpecs lists this driver's claim specs: their path by claim UID.
func (p *Plugin[R]) claimSpecs() (map[types.UID]string, error) {
	entries, err := os.ReadDir(p.opts.CDIDir)
	if err != nil {
		return nil, err
	}
	out := map[types.UID]string{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), p.specPrefix())
		if uid, isJSON := strings.CutSuffix(rest, ".json"); ok && isJSON {
			out[types.UID(uid)] = filepath.Join(p.opts.CDIDir, e.Name())
		}
	}
	return out, nil
}

// removeOrphanSpecs deletes claim specs of this driver whose claim is not
// prepared: left behind by a crash between writing and recording. A
// newer agent's spec (after a downgrade) is its to remove.
func (p *Plugin[R]) removeOrphanSpecs(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	specs, err := p.claimSpecs()
	if err != nil {
		return err
	}
	claims := p.cp.Load().Claims
	for uid, path := range specs {
		if _, owned := claims[uid]; owned {
			continue
		}
		if _, err := readSpecEntry[R](path, p.opts.BootID); errors.Is(err, state.ErrNewer) {
			logger.Info("Keeping the CDI spec of a claim a newer agent prepared", "file", path, "reason", err)
			continue
		}
		logger.Info("Removing orphaned CDI spec", "file", path)
		if err := p.removeSpec(uid); err != nil {
			return err
		}
	}
	return nil
}
