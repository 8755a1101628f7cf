{{/* The agent's identity: RBAC, the admission policy and the e2e suite name it. */}}
{{- define "hwdra.agent" -}}hwdra-agent{{- end -}}

{{- define "hwdra.labels" -}}
app.kubernetes.io/name: hwdra
app.kubernetes.io/component: node-agent
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hwdra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* --hardware: mock: alone means the chart's mockProfile. */}}
{{- define "hwdra.hardware" -}}
{{- if eq .Values.hardware "mock:" -}}
{{- if not .Values.mockProfile -}}{{- fail "hardware: mock: needs mockProfile (a mock profile's YAML)" -}}{{- end -}}
mock:/etc/hwdra/mock-profile.yaml
{{- else if or (eq .Values.hardware "host") (hasPrefix "mock:" .Values.hardware) -}}
{{ .Values.hardware }}
{{- else -}}
{{- fail (printf "hardware: %q: want host or mock:<profile>" .Values.hardware) -}}
{{- end -}}
{{- end -}}

{{/*
The node paths the agent looks for the NVIDIA driver in when no
nvidiaDriverRoot is given (internal/backend's KnownRoots), each mounted
read-only at /host<path>: the GPU operator's driver container's root
(created empty where none runs yet: the container mounts it later, and
HostToContainer shows that mount); for a driver installed on the node
itself ("/"), only /usr (programs and libraries, and /usr/local/nvidia),
/lib/firmware (the GSP firmware containers get) and /etc/cdi (the NVIDIA
Container Toolkit's spec); GKE's root (created empty on other nodes).
deploy/mounts_test.go holds this list to KnownRoots.
*/}}
{{- define "hwdra.driverSearchMounts" -}}
- {name: driver-container, path: /run/nvidia/driver, type: DirectoryOrCreate, propagate: true}
- {name: driver-host-usr, path: /usr, type: Directory}
- {name: driver-host-firmware, path: /lib/firmware, type: DirectoryOrCreate}
- {name: driver-host-cdi, path: /etc/cdi, type: DirectoryOrCreate}
- {name: driver-gke, path: /home/kubernetes/bin/nvidia, type: DirectoryOrCreate}
{{- end -}}

{{/*
An extended resource name as the API server takes it (k8s.io/kubernetes
pkg/apis/core/v1/helper IsExtendedResourceName: <domain>/<name> outside
kubernetes.io, "requests.<domain>/<name>" a qualified name), else a render
error naming the value. Argument: (list "<values path>" name).
*/}}
{{- define "hwdra.extendedResourceName" -}}
{{- $field := index . 0 -}}
{{- $name := index . 1 -}}
{{- $parts := splitList "/" $name -}}
{{- $ok := and (eq (len $parts) 2) (not (contains "kubernetes.io/" $name)) (not (hasPrefix "requests." $name)) -}}
{{- if $ok -}}
{{- $domain := printf "requests.%s" (index $parts 0) -}}
{{- $short := index $parts 1 -}}
{{- $ok = and (le (len $domain) 253) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $domain) (le (len $short) 63) (regexMatch "^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$" $short) -}}
{{- end -}}
{{- if not $ok -}}
{{- fail (printf "%s: %q is no extended resource name: want <domain>/<name> outside kubernetes.io, like nvidia.com/gpu (the domain in lower case, the name up to 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)" $field $name) -}}
{{- end -}}
{{ $name }}
{{- end -}}

{{/* The MIG profiles of extendedResources.migProfiles, checked: a profile
names a DeviceClass (mig-<profile>.gpu.hwdra.io, a DNS subdomain). */}}
{{- define "hwdra.migProfile" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" (toString .)) -}}
{{- fail (printf "extendedResources.migProfiles: %q is no MIG profile name like 1g.10gb (lower case letters, digits, '-' and '.')" (toString .)) -}}
{{- end -}}
{{ . }}
{{- end -}}

{{/*
The chart's DeviceClasses: the one list deviceclasses.yaml renders and
NOTES.txt names, so that the notes never miss a class. Each has name,
what (the notes' words), doc (the comment above it), expression (the
selector's lines), optional config (a GpuConfig's parameters) and
extendedResourceName (hwdra.extendedResources). YAML: include it and
fromYamlArray.
*/}}
{{- define "hwdra.deviceClasses" -}}
{{- $ext := .Values.extendedResources -}}
{{- $gpuDriver := `device.driver == "gpu.hwdra.io" &&` -}}
{{- $typeIn := `"type" in device.attributes["gpu.hwdra.io"] &&` -}}
{{- $classes := list -}}
{{- $classes = append $classes (dict "name" "gpu.hwdra.io" "what" "whole GPUs" "doc" "" "expression" (list $gpuDriver `"profile" in device.attributes["gpu.hwdra.io"] &&` `device.attributes["gpu.hwdra.io"].profile == "full"`)) -}}
{{- $classes = append $classes (dict "name" "mig.gpu.hwdra.io" "what" "MIG partitions of any profile"
  "doc" "A MIG partition of any profile; a claim picks the profile with its own\nselector (see examples/mig-1g.10gb.yaml)."
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "mig"`)) -}}
{{- range $ext.migProfiles -}}
{{- $profile := include "hwdra.migProfile" . -}}
{{- $classes = append $classes (dict "name" (printf "mig-%s.gpu.hwdra.io" $profile) "what" (printf "MIG partitions of profile %s" $profile)
  "doc" (printf "MIG partitions of profile %s, for pods asking for %s%s." $profile $ext.migPrefix $profile)
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "mig" &&` `"profile" in device.attributes["gpu.hwdra.io"] &&` (printf `device.attributes["gpu.hwdra.io"].profile == %q` $profile))) -}}
{{- end -}}
{{- $classes = append $classes (dict "name" "vgpu.gpu.hwdra.io" "what" "vGPUs of any type"
  "doc" "A vGPU of any type; a claim picks the type with a selector on profile."
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "vgpu"`)) -}}
{{- $classes = append $classes (dict "name" "passthrough.gpu.hwdra.io" "what" "whole GPUs bound to vfio-pci, for VMs"
  "doc" `A whole GPU bound to vfio-pci, for a VM (KubeVirt, Kata): the claim's
container gets the GPU's VFIO group node and /dev/vfio/vfio, and
HWDRA_<DEVICE>_PCI with its PCI address. Such a GPU is never also offered
to containers: NVML, and so every other GPU device, does not see it.`
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "passthrough"`)) -}}
{{- $classes = append $classes (dict "name" "share.gpu.hwdra.io" "what" "GPU shares, policed"
  "doc" `A share of a GPU: part of its memory and compute, which independent claims
take side by side (capacity.requests: gpu.hwdra.io/memory in bytes,
gpu.hwdra.io/compute in percent of the GPU's multiprocessors; the request
policy supplies what a claim leaves out, 4Gi and 10). A GPU offers shares
while it is not in MIG mode; the first share keeps its whole GPU, MIG
partitions and vGPUs away, and they keep shares away. Each share's
containers run under the GPU's MPS server of its policed shares, given
what it consumed as limits in their environment, and the agent polices
them (GpuConfig share.isolation Policed, the default).`
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "share"`)) -}}
{{- $classes = append $classes (dict "name" "dedicated-share.gpu.hwdra.io" "what" "GPU shares under an MPS server of their own"
  "doc" `A dedicated share of a GPU: the same devices and capacities as
share.gpu.hwdra.io, beside its policed shares on the same GPU, but the
share runs under an MPS server of its own whose defaults are what it
consumed: ceilings its processes cannot raise from their environment.
The price, measured on an H200: two servers on a GPU take turns (two
shares of 40% and 30% computed 44% less together under two servers than
under one), and the GPU is in compute mode Default while a dedicated
share is on it. A claim's own GpuConfig replaces this one.`
  "expression" (list $gpuDriver $typeIn `device.attributes["gpu.hwdra.io"].type == "share"`)
  "config" (dict "apiVersion" "gpu.hwdra.io/v1alpha1" "kind" "GpuConfig" "share" (dict "isolation" "Dedicated"))) -}}
{{- $classes = append $classes (dict "name" "vf-share.sriov.hwdra.io" "what" "VFs with a share of their PF's bandwidth"
  "doc" `A share of a PF: one VF and a part of the PF's bandwidth. The claim says
how much (capacity.requests["sriov.hwdra.io/bandwidth"]); the PF's
requestPolicy supplies the default. The scheduler never gives a PF's
shares more than its link speed; on Ethernet the VF's transmit rate is
capped at the share (max_tx_rate), and guaranteed it (min_tx_rate) where
the PF's driver takes a minimum: mlx5 (with the firmware's eswitch
bandwidth share) and ice (with DCB off). The device metadata says what
the VF got (sriov.hwdra.io/minTxRateMbps, maxTxRateMbps); docs/user-guide.md
lists what a share gets per link type and driver.`
  "expression" (list `device.driver == "sriov.hwdra.io" && "mode" in device.attributes["sriov.hwdra.io"] &&` `device.attributes["sriov.hwdra.io"].mode == "shared"`)) -}}
{{- $classes = append $classes (dict "name" "vf.sriov.hwdra.io" "what" "whole VFs, exclusively (PFs in exclusive mode)"
  "doc" `A whole VF, exclusively (PFs configured in exclusive mode, and every
PF where the cluster has DRAConsumableCapacity off). The classes test the
published mode, not device.allowMultipleAllocations: without that gate
the API server's CEL knows no such field and refuses the class.`
  "expression" (list `device.driver == "sriov.hwdra.io" && "mode" in device.attributes["sriov.hwdra.io"] &&` `device.attributes["sriov.hwdra.io"].mode == "exclusive"`)) -}}
{{- include "hwdra.extendedResources" (list $ext $classes) -}}
{{- toYaml $classes -}}
{{- end -}}

{{/*
Gives the chart's DeviceClasses their extendedResourceName from the
values, each checked: extendedResources.gpu (gpu.hwdra.io), shared
(share.gpu.hwdra.io), each of migProfiles (migPrefix + profile, its
mig-<profile> class), and each {name, class} of classes. A name the API
server would refuse, a name given twice, a class the chart does not
render or one given two names fails the render, naming the value.
Argument: (list .Values.extendedResources classes); it sets the classes'
extendedResourceName and adds the name to their notes' words.
*/}}
{{- define "hwdra.extendedResources" -}}
{{- $ext := index . 0 -}}
{{- $classes := index . 1 -}}
{{- $wants := list -}}
{{- with $ext.gpu -}}
{{- $wants = append $wants (dict "field" "extendedResources.gpu" "name" . "class" "gpu.hwdra.io") -}}
{{- end -}}
{{- with $ext.shared -}}
{{- $wants = append $wants (dict "field" "extendedResources.shared" "name" . "class" "share.gpu.hwdra.io") -}}
{{- end -}}
{{- range $ext.migProfiles -}}
{{- $wants = append $wants (dict "field" "extendedResources.migPrefix + migProfiles" "name" (printf "%s%s" $ext.migPrefix .) "class" (printf "mig-%s.gpu.hwdra.io" .)) -}}
{{- end -}}
{{- range $i, $e := $ext.classes -}}
{{- $wants = append $wants (dict "field" (printf "extendedResources.classes[%d].name" $i) "name" $e.name "class" $e.class "classField" (printf "extendedResources.classes[%d].class" $i)) -}}
{{- end -}}
{{- $byName := dict -}}
{{- $all := list -}}
{{- range $classes -}}{{- $all = append $all .name -}}{{- end -}}
{{- range $want := $wants -}}
{{- $name := include "hwdra.extendedResourceName" (list $want.field $want.name) -}}
{{- with get $byName $name -}}
{{- fail (printf "%s: %s is named twice (also by %s): each extended resource maps to one DeviceClass" $want.field $name .) -}}
{{- end -}}
{{- $_ := set $byName $name $want.field -}}
{{- $class := dict -}}
{{- range $classes -}}{{- if eq .name $want.class -}}{{- $class = . -}}{{- end -}}{{- end -}}
{{- if not $class -}}
{{- fail (printf "%s: %q is none of the chart's DeviceClasses (%s)" $want.classField $want.class (join ", " $all)) -}}
{{- end -}}
{{- with $class.extendedResourceName -}}
{{- fail (printf "%s: %s already has extendedResourceName %s: a DeviceClass maps one extended resource" ($want.classField | default $want.field) $want.class .) -}}
{{- end -}}
{{- $_ := set $class "extendedResourceName" $name -}}
{{- $_ := set $class "what" (printf "%s, for pods asking for %s" $class.what $name) -}}
{{- end -}}
{{- end -}}

{{/*
The claim-limits policy's CEL (templates/claim-limits-policy.yaml). CEL
in admission has no let and wants lists of one type, so each device
request (an exact request or a firstAvailable alternative) is first made a
map of strings by hwdra.claimAlt: its name, class, count, "y" for
allocationMode All, and its profile: the class's (mig-<profile>.gpu.hwdra.io)
or the first selector's `profile == "..."`. hwdra.claimPerGPU is how many
of it one GPU holds: whole and passthrough GPUs one, MIG profiles and vGPU
types as files/per-gpu-limits.json says, 0 (no limit) for the rest.
*/}}
{{- define "hwdra.claimAlt" -}}
{{- $x := index . 0 -}}{{- $name := index . 1 -}}
{{- $p := `r'profile["\]\s]*==\s*"[^"]+"'` -}}
{'name': string({{ $name }}), 'class': string({{ $x }}.deviceClassName),
 'count': string(has({{ $x }}.count) ? {{ $x }}.count : 1),
 'all': string(has({{ $x }}.allocationMode) && {{ $x }}.allocationMode == 'All' ? 'y' : ''),
 'profile': string({{ $x }}.deviceClassName.startsWith('mig-') && {{ $x }}.deviceClassName.endsWith('.gpu.hwdra.io') ?
   {{ $x }}.deviceClassName.substring(4, size({{ $x }}.deviceClassName) - 13) :
   has({{ $x }}.selectors) && {{ $x }}.selectors.exists(s, has(s.cel) && s.cel.expression.matches({{ $p }})) ?
   {{ $x }}.selectors.filter(s, has(s.cel) && s.cel.expression.matches({{ $p }}))[0].cel.expression.find({{ $p }}).find(r'"[^"]+"$').replace('"', '') : '')}
{{- end -}}

{{- define "hwdra.claimPerGPU" -}}
(a.class in ['gpu.hwdra.io', 'passthrough.gpu.hwdra.io'] ? 1 :
 (a.class in ['mig.gpu.hwdra.io', 'vgpu.gpu.hwdra.io'] || a.class.startsWith('mig-')) && a.profile in variables.perGPU ? variables.perGPU[a.profile] : 0)
{{- end -}}

{{- define "hwdra.claimRefused" -}}
a.all == '' && {{ include "hwdra.claimPerGPU" . }} > 0 && int(a.count) > {{ include "hwdra.claimPerGPU" . }} * {{ . }}
{{- end -}}

{{- define "hwdra.claimRefusal" -}}
'request ' + a.name + ': ' + a.count + ' x ' + (a.profile == '' ? 'whole GPU' : a.profile) + ' of class ' + a.class +
 ', no node holds more than ' + string({{ include "hwdra.claimPerGPU" . }} * {{ . }}) + ' (' + string({{ include "hwdra.claimPerGPU" . }}) + ' per GPU, {{ . }} GPUs per node)'
{{- end -}}

{{/*
What the agent refuses in config and values.schema.json cannot say:
rules across fields and byte counts (the schema counts characters). A
config the chart renders and the agent refuses would crash-loop every
agent pod; deploy/config_test.go holds the chart to the agent. The VLAN
ranges' order is checked in vf-policy.yaml.
*/}}
{{- define "hwdra.checkConfig" -}}
{{- $c := .Values.config | default dict -}}
{{- range $i, $n := dig "nics" (list) $c -}}
{{- include "hwdra.checkNetdevNames" (list (printf "config.nics[%d].select" $i) $n) -}}
{{- end -}}
{{- range $i, $p := dig "vfPolicy" "pfs" (list) $c -}}
{{- include "hwdra.checkNetdevNames" (list (printf "config.vfPolicy.pfs[%d].select" $i) $p) -}}
{{- end -}}
{{- $ignore := dig "health" "xids" "ignore" (list) $c -}}
{{- range $i, $x := dig "health" "xids" "report" (list) $c -}}
{{- if has $x $ignore -}}
{{- fail (printf "config.health.xids.report[%d]: %v is also in config.health.xids.ignore: an XID is either a device failure or not" $i $x) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A netdev name is at most 15 bytes (the kernel's IFNAMSIZ, 16 with
its NUL). Argument: (list "<values path>" rule). */}}
{{- define "hwdra.checkNetdevNames" -}}
{{- $path := index . 0 -}}
{{- range $j, $name := dig "select" "names" (list) (index . 1) -}}
{{- if gt (len $name) 15 -}}
{{- fail (printf "%s.names[%d]: %q is %d bytes: a netdev name is 1 to 15 bytes" $path $j $name (len $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
