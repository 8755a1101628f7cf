// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package model holds the hardware the mock can build, as the real boards
// report it: GPU models with their MIG profile tables (placements in
// memory slices, the driver's profile IDs, engine counts) and the SR-IOV
// NIC models (PCI IDs, drivers, link speeds, VF limits). Profiles name
// these models; the GPU and NIC simulations build from them.
package model

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// GPU is one GPU model the mock can build: go-nvml's identity of the
// board (name, architecture, memory, PCI device ID) plus a MIG profile table
// that says what the real board reports.
//
// Why our own table rather than go-nvml's gpus.*_MIGProfiles:
//   - go-nvml gives the H100/H200/B200 placements in compute-slice units (7g
//     size 7, 3g size 3 at 0 and 4, 1g.20gb size 1 at 0..6). NVML reports
//     memory slices: 8 per GPU (4 on A30); 1g.10gb size 1 at 0..6, 1g.20gb
//     size 2 at 0,2,4,6, 2g size 2 at 0,2,4, 3g size 4 at 0,4, 4g size 4 at
//     0, 7g size 8 at 0 (`nvidia-smi mig -lgipp`; MIG user guide, "Supported
//     MIG Profiles" placement diagrams).
//   - go-nvml sets each profile's Id to its GPU_INSTANCE_PROFILE_* index.
//     NVML's nvmlGpuInstanceProfileInfo_t.id is the driver's own profile ID
//     (the "ID" column of `nvidia-smi mig -lgip`: 1g.10gb is 19, 1g.10gb+me
//     20, 1g.20gb 15, 2g 14, 3g 9, 4g 5, 7g 0), and GpuInstanceInfo.ProfileId
//     and the vGPU GI profile ID carry that ID, not the index.
//   - engine and SM counts follow `nvidia-smi mig -lgip` on the real boards
//     and the MIG user guide tables (see each model below).
//   - compute-instance placements are filled in (go-nvml's A100 ones are
//     empty) by the rule the hardware follows, see ciPlacements.
type GPU struct {
	Name   string // "h100-80gb"
	Config gpus.Config
	// Short is the board name in vGPU type names ("H100").
	Short string
	// MemSlices and ComputeSlices are what placements and GI slice
	// counts add up to.
	MemSlices, ComputeSlices int
	Profiles                 []MIGProfile
}

// MIGProfile is one GPU instance profile as `nvidia-smi mig -lgip` and
// `-lgipp` print it.
type MIGProfile struct {
	Index int    // NVML's GPU_INSTANCE_PROFILE_* constant
	ID    uint32 // the driver's profile ID (nvmlGpuInstanceProfileInfo_t.id)
	Name  string // canonical name, as GetGpuInstanceProfileInfoV's v3 name without "MIG "
	// Slices: compute slices; Count: max instances.
	Slices, Count               int
	SM, CE, Dec, Enc, JPEG, OFA int
	MemMB                       uint64
	Starts                      []int // placement starts, in memory slices
	Size                        int   // placement size, in memory slices
}

var (
	seq7 = []int{0, 1, 2, 3, 4, 5, 6}
	seq4 = []int{0, 1, 2, 3}
)

// hopperProfiles is the GH100 table (H100 SXM5 80GB), shared by H200 with
// other memory sizes. Source: `nvidia-smi mig -lgip` on an H100 80GB
// (memory 9.75/19.62/39.50/79.25 GiB; SM 16/16/26/32/60/64/132; CE 8 on 7g)
// and the MIG user guide's H100 table (1 NVDEC + 1 NVJPG per compute slice,
// 7g.80gb 7 NVDEC/7 NVJPG/1 OFA, OFA otherwise only on +me). go-nvml gave
// no JPEG engines outside +me, 7g 5 decoders, 2g/3g/4g one or two,
// 1g.20gb 16 SMs, 3g 48 SMs, 7g 112 SMs and 7 copy engines.
func hopperProfiles(mem1, mem2, mem4, mem8 uint64) []MIGProfile {
	return []MIGProfile{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "", 1, 7, 16, 1, 1, 0, 1, 0, mem1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "+me", 1, 1, 16, 1, 1, 0, 1, 1, mem1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "", 1, 4, 26, 1, 1, 0, 1, 0, mem2, []int{0, 2, 4, 6}, 2},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "", 2, 3, 32, 2, 2, 0, 2, 0, mem2, []int{0, 2, 4}, 2},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "", 3, 2, 60, 3, 3, 0, 3, 0, mem4, []int{0, 4}, 4},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "", 4, 1, 64, 4, 4, 0, 4, 0, mem4, []int{0}, 4},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "", 7, 1, 132, 8, 7, 0, 7, 1, mem8, []int{0}, 8},
	}
}

// ampereProfiles is the GA100 table (A100). Source: `nvidia-smi mig -lgip`
// on an A100-SXM4-40GB (memory 4.75/9.62/19.50/39.25 GiB, SM 14 per slice,
// 98 on 7g) and the MIG user guide's A100 table (1g.5gb: 0 NVDEC; 1g.5gb+me
// 1 NVDEC/1 JPEG/1 OFA; 1g.10gb, 2g: 1 NVDEC; 3g, 4g: 2; 7g 5 NVDEC/1 JPEG/
// 1 OFA). dec1 is the 1/8-memory 1g profile's decoder count: go-nvml gives
// the A100-80GB 1g.10gb one decoder, but it is the same partition as the
// 40GB's 1g.5gb (the guide: "profile names change according to the memory
// proportion"), which has none.
func ampereProfiles(mem1, mem2, mem4, mem8 uint64) []MIGProfile {
	return []MIGProfile{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "", 1, 7, 14, 1, 0, 0, 0, 0, mem1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "+me", 1, 1, 14, 1, 1, 0, 1, 1, mem1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "", 1, 4, 14, 1, 1, 0, 0, 0, mem2, []int{0, 2, 4, 6}, 2},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "", 2, 3, 28, 2, 1, 0, 0, 0, mem2, []int{0, 2, 4}, 2},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "", 3, 2, 42, 3, 2, 0, 0, 0, mem4, []int{0, 4}, 4},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "", 4, 1, 56, 4, 2, 0, 0, 0, mem4, []int{0}, 4},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "", 7, 1, 98, 7, 5, 0, 1, 1, mem8, []int{0}, 8},
	}
}

// a30Profiles: the A30 has 4 memory and 4 compute slices. Source: MIG user
// guide's A30 table (1g.6gb 0 NVDEC x4; 1g.6gb+me 1/1/1; 2g.12gb 2 NVDEC x2;
// 2g.12gb+me 2 NVDEC/1 JPEG/1 OFA; 4g.24gb 4 NVDEC/1 JPEG/1 OFA); memory
// sizes are go-nvml's. The driver profile IDs (14, 21, 5, 6, 0) follow
// A30 `nvidia-smi mig -lgip` output as we know it; not checked on a board.
func a30Profiles() []MIGProfile {
	return []MIGProfile{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 14, "", 1, 4, 14, 1, 0, 0, 0, 0, 5836, seq4, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 21, "+me", 1, 1, 14, 1, 1, 0, 1, 1, 5836, seq4, 1},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 5, "", 2, 2, 28, 2, 2, 0, 0, 0, 11672, []int{0, 2}, 2},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, 6, "+me", 2, 1, 28, 2, 2, 0, 1, 1, 11672, []int{0, 2}, 2},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, "", 4, 1, 56, 4, 4, 0, 1, 1, 23344, []int{0}, 4},
	}
}

// blackwellProfiles is the B200 table. Names (1g.23gb, 1g.45gb, 2g.45gb,
// 3g.90gb, 4g.90gb, 7g.180gb) are NVIDIA's; the media-engine layout follows
// the Hopper scheme of the MIG user guide. go-nvml's B200 table gives small
// profiles encoders and up to 4 OFAs, and 1-slice memory (23552 MB) above
// 1/8 of the board, which NVIDIA's naming would call 1g.45gb; sizes here
// are scaled from H100's and SM counts are go-nvml's (unverified). The
// -me and +me.all variants (NO_ME, ALL_ME) are listed by R575+ drivers on
// Blackwell; their driver IDs here are illustrative.
func blackwellProfiles() []MIGProfile {
	const m1, m2, m4, m8 = 22400, 45056, 90752, 182016
	return []MIGProfile{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "", 1, 7, 18, 1, 1, 0, 1, 0, m1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "+me", 1, 1, 18, 1, 1, 0, 1, 1, m1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "", 1, 4, 18, 1, 1, 0, 1, 0, m2, []int{0, 2, 4, 6}, 2},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 21, "-me", 1, 7, 18, 1, 0, 0, 0, 0, m1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 47, "+me.all", 1, 1, 18, 1, 7, 0, 7, 1, m1, seq7, 1},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "", 2, 3, 36, 2, 2, 0, 2, 0, m2, []int{0, 2, 4}, 2},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, 22, "-me", 2, 3, 36, 2, 0, 0, 0, 0, m2, []int{0, 2, 4}, 2},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME, 48, "+me.all", 2, 1, 36, 2, 7, 0, 7, 1, m2, []int{0, 2, 4}, 2},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "", 3, 2, 54, 3, 3, 0, 3, 0, m4, []int{0, 4}, 4},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "", 4, 1, 72, 4, 4, 0, 4, 0, m4, []int{0}, 4},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "", 7, 1, 126, 8, 7, 0, 7, 1, m8, []int{0}, 8},
	}
}

// models is every GPU model the mock knows, by name. Board identities
// (product name, memory, PCI device ID, compute capability) are go-nvml's,
// except that "Mock " is dropped from the A100-SXM4-40GB name and the H200
// is the real one (below).
var models = func() map[string]*GPU {
	a100x40 := gpus.A100_SXM4_40GB
	a100x40.Name = "NVIDIA A100-SXM4-40GB"
	// H200 as a real H200 SXM 141GB reports itself (driver 580.159.04,
	// testdata/probe-h200.yaml, TestH200AsProbed): go-nvml's "NVIDIA H200
	// 141GB HBM3e", device 0x2333 and 144384 MiB are not what NVML says.
	h200 := gpus.H200_SXM5_141GB
	h200.Name, h200.PciDeviceId, h200.MemoryMB = "NVIDIA H200", 0x233510DE, 143771
	list := []*GPU{
		{Name: "a100-40gb", Config: a100x40, Short: "A100", MemSlices: 8, ComputeSlices: 7,
			Profiles: ampereProfiles(4864, 9856, 19968, 40192)},
		{Name: "a100-80gb", Config: gpus.A100_SXM4_80GB, Short: "A100D", MemSlices: 8, ComputeSlices: 7,
			Profiles: ampereProfiles(9856, 19968, 40192, 80384)},
		{Name: "a30-24gb", Config: gpus.A30_PCIE_24GB, Short: "A30", MemSlices: 4, ComputeSlices: 4,
			Profiles: a30Profiles()},
		{Name: "h100-80gb", Config: gpus.H100_SXM5_80GB, Short: "H100", MemSlices: 8, ComputeSlices: 7,
			Profiles: hopperProfiles(9984, 20096, 40448, 81152)},
		// H200: MIG memory as the real board reports it (MiB): 1g 16384,
		// 1g.35gb and 2g 33280, 3g and 4g 71424, 7g 143360. (go-nvml's 1g
		// 18432 MB is above 1/8 of the board, which NVIDIA's naming would
		// call 1g.35gb; H100's ratios gave 32896, 66304 and 133120.)
		{Name: "h200-141gb", Config: h200, Short: "H200", MemSlices: 8, ComputeSlices: 7,
			Profiles: hopperProfiles(16384, 33280, 71424, 143360)},
		{Name: "b200-180gb", Config: gpus.B200_SXM5_180GB, Short: "B200", MemSlices: 8, ComputeSlices: 7,
			Profiles: blackwellProfiles()},
	}
	m := make(map[string]*GPU, len(list))
	for _, g := range list {
		g.fillNames()
		m[g.Name] = g
	}
	return m
}()

// LookupGPU returns the GPU model of a name ("h100-80gb").
func LookupGPU(name string) (*GPU, bool) {
	g, ok := models[name]
	return g, ok
}

// GPUNames lists the GPU model names a profile may use.
func GPUNames() []string {
	names := make([]string, 0, len(models))
	for n := range models {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// fillNames turns each row's suffix into the full canonical name
// "<slices>g.<GB>gb<suffix>", GB as NVIDIA rounds it (see migGB).
func (g *GPU) fillNames() {
	for i := range g.Profiles {
		p := &g.Profiles[i]
		p.Name = SliceName(p.Slices, migGB(g.Config.MemoryMB, p.MemMB)) + p.Name
	}
}

// ProfileByName returns the MIG profile with a canonical name.
func (g *GPU) ProfileByName(name string) (MIGProfile, bool) {
	for _, p := range g.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// ProfileByID returns the MIG profile with a driver profile ID.
func (g *GPU) ProfileByID(id uint32) (MIGProfile, bool) {
	for _, p := range g.Profiles {
		if p.ID == id {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// ProfileNames lists the model's MIG profile names in table order.
func (g *GPU) ProfileNames() []string {
	var names []string
	for _, p := range g.Profiles {
		names = append(names, p.Name)
	}
	return names
}

// HopperOrLater: MIG mode changes apply without a GPU reset, and vGPU
// heterogeneous (mixed-size time-sliced) mode exists.
func (g *GPU) HopperOrLater() bool {
	return g.Config.Architecture >= nvml.DEVICE_ARCH_HOPPER
}
