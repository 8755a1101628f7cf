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
