// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/state"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// crashNode is cx7Node with two VFs: all the crash tests need.
const crashNode = `nics: [{model: cx7, count: 1, vfs: 2, pciAddresses: ["0000:17:00.0"], netdevs: [pfa]}]`

// crashClaim: two shares of one PF, every setting given, so that a
// prepare has many side effects: per VF the ledger entry and each field
// SetVF applies.
func crashClaim(e *env) *resourceapi.ResourceClaim {
	return e.allocate(newClaim(`, "mac": "02:00:00:00:bb:01", "vlan": 7, "vlanQoS": 1, "trust": true, "mtu": 4000`,
		share("a", "10G"), share("b", "20G")))
}

// events installs a counter on every side effect of a prepare: the
// driver's steps and each VF field the mock applies. at(n, name) is
// called with the running count before (field) or after (step) each.
func events(e *env, at func(n int, name string) error) {
	n := 0
	e.driver.hook = func(step string) {
		n++
		_ = at(n, step)
	}
	e.vfs.SetFault(func(ref hw.VFRef, field string) error {
		n++
		return at(n, "before "+field)
	})
}

// sideEffects lists a prepare's events in order, from a clean run.
func sideEffects(t *testing.T) []string {
	e := newEnv(t, crashNode, "")
	var names []string
	events(e, func(n int, name string) error { names = append(names, name); return nil })
	e.mustPrepare(crashClaim(e))
	e.vfs.SetFault(nil)
	return names
}

// TestCrashDuringPrepare: the agent dies after each side effect of a
// two-share prepare (or just before a VF field is applied, i.e. after the
// previous one). A fresh agent on the same state dir and hardware rolls
// the claim back: no VF held or changed, the ledger empty, and the claim
// prepares again. With the checkpoint lost too, the ledger alone restores
// the VFs.
func TestCrashDuringPrepare(t *testing.T) {
	names := sideEffects(t)
	if len(names) < 10 || names[0] != "ledger" || names[len(names)-1] != "configured" {
		t.Fatalf("side effects %v", names)
	}
	for _, lose := range []bool{false, true} {
		for i, name := range names {
			t.Run(fmt.Sprintf("checkpoint lost %t/%02d %s", lose, i+1, name), func(t *testing.T) {
				e := newEnv(t, crashNode, "")
				c := crashClaim(e)
				events(e, func(n int, _ string) error {
					if n == i+1 {
						runtime.Goexit() // the process dies here: no rollback, no more writes
					}
					return nil
				})
				done := make(chan struct{})
				go func() {
					defer close(done)
					e.plugin.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
					t.Error("prepare did not crash")
				}()
				<-done
				e.vfs.SetFault(nil)
				applied := false // a VF field was applied before this point
				for _, n := range names[:i] {
					applied = applied || strings.HasPrefix(n, "before ")
				}
				if applied && reflect.DeepEqual(e.vfs.Snapshot(), e.initial) {
					t.Fatalf("no VF changed before crash point %s: the test injects nothing", name)
				}
				if lose {
					checkpoint := filepath.Join(e.stateDir(), device.NICDriver+".checkpoint.json")
					if err := state.Replace(checkpoint, []byte("{torn")); err != nil {
						t.Fatal(err)
					}
				}
				e.start()
				if len(e.plugin.Prepared()) != 0 {
					t.Error("a half-prepared claim counts as prepared")
				}
				e.checkPristine()
				res := e.mustPrepare(c)
				if len(res.Devices) != 2 || e.vfs.Snapshot()["pfa/1"].MaxTxRateMbps != 20000 {
					t.Errorf("prepare after the crash: %+v", res.Devices)
				}
				if err := e.unprepare(c); err != nil {
					t.Fatal(err)
				}
				e.checkPristine()
			})
		}
	}
}

// TestRefusedSetting: the driver refuses one VF field (each in turn),
// leaving the ones before it applied; the plugin rolls back at once from
// the saved originals, and nothing stays changed or held.
func TestRefusedSetting(t *testing.T) {
	for _, field := range []string{"MAC", "VLAN", "rate", "spoofchk", "trust", "MTU"} {
		for _, vf := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s of VF %d", field, vf), func(t *testing.T) {
				e := newEnv(t, crashNode, "")
				c := crashClaim(e)
				refused := false // once: the restore then goes through
				e.vfs.SetFault(func(ref hw.VFRef, f string) error {
					if f == field && ref.Index == vf && !refused {
						refused = true
						return unix.EIO
					}
					return nil
				})
				_, err := e.prepare(c)
				if err == nil || !strings.Contains(err.Error(), "setting "+field) || !strings.Contains(err.Error(), c.Name) {
					t.Fatalf("prepare: %v", err)
				}
				e.vfs.SetFault(nil)
				e.checkPristine()
				if len(e.plugin.Prepared()) != 0 {
					t.Error("failed claim prepared")
				}
			})
		}
	}
}

// TestRestoreFailureKeepsTheVF: a VF that cannot be restored stays held
// and in the ledger, so no other claim gets it; the kubelet's retry
// restores it.
func TestRestoreFailureKeepsTheVF(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	c := e.allocate(newClaim(`, "vlan": 9`, share("nic", "5G")))
	e.mustPrepare(c)
	e.vfs.SetFault(func(hw.VFRef, string) error { return unix.EBUSY })
	if err := e.unprepare(c); err == nil {
		t.Fatal("unprepare with a refusing VF succeeded")
	}
	if held := e.driver.Held(); len(held) != 1 || len(e.driver.ledger.Keys()) != 1 {
		t.Fatalf("after a failed restore: held %v, ledger %v", held, e.driver.ledger.Keys())
	}
	// What is left, as the lab reports it: the VF, its PF and number,
	// and what it had before.
	left, err := Leftovers(e.stateDir())
	want := []Leftover{{PCIAddress: "0000:17:01.0", PF: "pfa", Index: 0, Original: e.initial["pfa/0"]}}
	if err != nil || !reflect.DeepEqual(left, want) {
		t.Errorf("Leftovers: %+v, %v; want %+v", left, err, want)
	}
	// A claim prepared meanwhile does not get the VF.
	other := e.allocate(newClaim("", share("nic", "5G")))
	e.vfs.SetFault(nil)
	e.mustPrepare(other)
	if got := e.vfs.Snapshot()["pfa/1"].MaxTxRateMbps; got != 5000 {
		t.Errorf("second claim's VF 1 rate %d", got)
	}
	if err := e.unprepare(c); err != nil {
		t.Fatalf("retried unprepare: %v", err)
	}
	if err := e.unprepare(other); err != nil {
		t.Fatal(err)
	}
	if left, err := Leftovers(e.stateDir()); err != nil || len(left) != 0 {
		t.Errorf("Leftovers after the retry: %+v, %v", left, err)
	}
	e.checkPristine()
}

// TestReconcile: at start the ledger's VFs that no prepared claim holds
// are restored, those a prepared claim holds are kept, and entries from
// before a reboot are dropped without touching the VF.
func TestReconcile(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	kept := e.allocate(newClaim(`, "vlan": 11`, share("nic", "3G")))
	e.mustPrepare(kept)
	// VF 5 changed by a claim whose record is gone, VF 6 in an earlier boot.
	lost := hw.VFConfig{VLAN: 99, MaxTxRateMbps: 1000, MTU: 1500, NetdevUp: new(bool)}
	for _, vf := range []struct {
		index int
		boot  string
	}{{5, testBoot}, {6, "boot-0"}} {
		ref := hw.VFRef{PF: "pfa", Index: vf.index, Netdev: fmt.Sprintf("pfav%d", vf.index)}
		orig, _ := e.vfs.GetVF(ref)
		addr := fmt.Sprintf("0000:17:01.%d", vf.index)
		if err := e.driver.ledger.Put(addr, LedgerEntry{Claim: types.UID("lost"), BootID: vf.boot, PF: "pfa", Index: vf.index, Original: orig}); err != nil {
			t.Fatal(err)
		}
		if err := e.vfs.SetVF(ref, lost); err != nil {
			t.Fatal(err)
		}
	}
	e.start()
	snap := e.vfs.Snapshot()
	if !reflect.DeepEqual(snap["pfa/5"], e.initial["pfa/5"]) {
		t.Errorf("VF 5 not restored: %+v", snap["pfa/5"])
	}
	if snap["pfa/6"].VLAN != 99 {
		t.Errorf("VF 6, from an earlier boot, was touched: %+v", snap["pfa/6"])
	}
	if snap["pfa/0"].VLAN != 11 || !reflect.DeepEqual(e.driver.Held(), []string{"0000:17:01.0"}) {
		t.Errorf("prepared claim's VF: %+v, held %v", snap["pfa/0"], e.driver.Held())
	}
	if keys := e.driver.ledger.Keys(); !reflect.DeepEqual(keys, []string{"0000:17:01.0"}) {
		t.Errorf("ledger %v", keys)
	}
}

// TestVFGoneAtUnprepare: a VF that disappeared (sriov_numvfs set to 0, the
// driver unloaded) has nothing to restore: unprepare succeeds rather than
// failing on every kubelet retry.
func TestVFGoneAtUnprepare(t *testing.T) {
	e := newEnv(t, crashNode, "")
	c := e.allocate(newClaim("", share("nic", "1G")))
	e.mustPrepare(c)
	if err := os.Remove(filepath.Join(e.hw.Sysfs, "bus/pci/devices/0000:17:01.0")); err != nil {
		t.Fatal(err)
	}
	e.vfs.SetFault(func(hw.VFRef, string) error { return unix.ENODEV })
	if err := e.unprepare(c); err != nil {
		t.Fatalf("unprepare of a vanished VF: %v", err)
	}
	if len(e.driver.Held()) != 0 || len(e.driver.ledger.Keys()) != 0 {
		t.Errorf("held %v, ledger %v", e.driver.Held(), e.driver.ledger.Keys())
	}
}

// TestStateLostBetweenPrepareAndUnprepare: the state directory deleted or
// every file in it corrupted while shares are prepared (a plain netdev VF
// and an RDMA one): the restarted driver rebuilds the claims from their
// CDI specs, leaves the VFs as the claims set them, and unprepare restores
// every VF exactly.
func TestStateLostBetweenPrepareAndUnprepare(t *testing.T) {
	for name, lose := range map[string]func(t *testing.T, dir string){
		"deleted": func(t *testing.T, dir string) { os.RemoveAll(dir) },
		"corrupt": func(t *testing.T, dir string) {
			files, _ := filepath.Glob(filepath.Join(dir, "*"))
			for _, f := range files {
				os.WriteFile(f, []byte("{garbage"), 0o600)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, `nics: [{model: cx7, count: 1, vfs: 2, pciAddresses: ["0000:17:00.0"], netdevs: [pfa]},
				{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfe]}]`, "")
			rdma := e.allocate(newClaim(`, "vlan": 7`, share("a", "10G")))
			b := share("b", "10G") // on the e810, whose VFs have no RDMA
			b.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["sriov.hwdra.io"].pfName == "pfe"`}}}
			plain := e.allocate(newClaim(`, "vlan": 8`, b))
			for _, c := range []*resourceapi.ResourceClaim{rdma, plain} {
				e.mustPrepare(c)
			}
			running := e.vfs.Snapshot()
			lose(t, e.stateDir())
			e.start()
			if got := e.vfs.Snapshot(); !reflect.DeepEqual(got, running) {
				t.Fatalf("the restart changed the prepared VFs: %v, was %v", got, running)
			}
			if got := e.plugin.Prepared(); len(got) != 2 {
				t.Fatalf("prepared after the restart: %v", got)
			}
			for _, c := range []*resourceapi.ResourceClaim{rdma, plain} {
				if err := e.unprepare(c); err != nil {
					t.Fatal(err)
				}
			}
			e.checkPristine()
		})
	}
}
