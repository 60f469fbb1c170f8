{{/* The chart's name, or nameOverride. */}}
{{- define "busbar.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The objects' name: fullnameOverride, else the release's name when it holds the chart's
     name already, else "<release>-<chart>". 57 characters at most, so that "-admin" fits in a
     Service name (63). */}}
{{- define "busbar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" -}}
{{- else if contains (include "busbar.name" .) .Release.Name -}}
{{- .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "busbar.name" .) | trunc 57 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "busbar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "busbar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "busbar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | trunc 63 }}
{{ include "busbar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: busbar
{{- end }}

{{/* The Secret the pods' environment comes from. */}}
{{- define "busbar.secretName" -}}
{{- .Values.secret.existingSecret | default (include "busbar.fullname" .) -}}
{{- end }}

{{/* Whether this release writes that Secret itself. */}}
{{- define "busbar.createSecret" -}}
{{- if and (not .Values.secret.existingSecret) .Values.secret.stringData -}}true{{- end -}}
{{- end }}

{{- define "busbar.redisSecretName" -}}
{{- .Values.redis.secretName | default (include "busbar.secretName" .) -}}
{{- end }}

{{- define "busbar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "busbar.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end }}

{{/* config.yaml: the listeners and the admin listener's TLS from the chart's values, then the
     `config:` values with advanced.worker_threads from `workers` merged into config.advanced
     (a worker_threads set there wins). A listener key given in `config:` too is a duplicate,
     which busbar refuses at boot. */}}
{{- define "busbar.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- if .Values.workers -}}
{{- $advanced := index $config "advanced" -}}
{{- if kindIs "invalid" $advanced -}}
{{- $advanced = dict -}}
{{- $_ := set $config "advanced" $advanced -}}
{{- end -}}
{{- /* Anything but a map is left as it is, for busbar to refuse. */ -}}
{{- if kindIs "map" $advanced -}}
{{- if not (hasKey $advanced "worker_threads") -}}
{{- $_ := set $advanced "worker_threads" (int .Values.workers) -}}
{{- end -}}
{{- end -}}
{{- end -}}
# Written by the chart: listen, admin_listen and the admin listener's TLS come from its values
# (ports, admin.mtls), advanced.worker_threads from `workers` unless config.advanced sets it; the
# rest is `config:` in values.yaml.
listen: "0.0.0.0:{{ .Values.ports.data }}"
admin_listen: "0.0.0.0:{{ .Values.ports.admin }}"
{{- if .Values.admin.mtls.enabled }}
admin_require_mtls: true
admin_tls:
  cert: {file: /etc/busbar/admin-tls/{{ .Values.admin.mtls.certKey }}}
  key: {file: /etc/busbar/admin-tls/{{ .Values.admin.mtls.keyKey }}}
  client_ca: {file: /etc/busbar/admin-tls/{{ .Values.admin.mtls.clientCAKey }}}
{{- else }}
# Off loopback without client certificates: the admin API still needs an admin token; see
# admin.mtls in the chart's values.yaml to require mTLS as well.
admin_require_mtls: false
{{- end }}
{{ toYaml $config }}
{{- end }}
