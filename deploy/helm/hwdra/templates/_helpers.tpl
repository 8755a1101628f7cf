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
