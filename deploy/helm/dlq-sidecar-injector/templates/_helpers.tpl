{{/* Helpers of the dlq-sidecar-injector chart (name/label helpers as in the `helm create` scaffold). */}}

{{- define "dlq-sidecar-injector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dlq-sidecar-injector.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dlq-sidecar-injector.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dlq-sidecar-injector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dlq-sidecar-injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dlq-sidecar-injector.labels" -}}
helm.sh/chart: {{ include "dlq-sidecar-injector.chart" . }}
{{ include "dlq-sidecar-injector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: admission-webhook
{{- end }}

{{/* The Secret holding tls.crt, tls.key and ca.crt (chart-generated, or cert-manager's). */}}
{{- define "dlq-sidecar-injector.tlsSecretName" -}}
{{- printf "%s-tls" (include "dlq-sidecar-injector.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The webhook's name: a domain-qualified name, unique in the cluster per release. */}}
{{- define "dlq-sidecar-injector.webhookName" -}}
{{- printf "%s.%s.dlq-sidecar.io" (include "dlq-sidecar-injector.fullname" .) .Release.Namespace }}
{{- end }}

{{/* repository@digest, or repository:tag (tag defaulting to $default). */}}
{{- define "dlq-sidecar-injector.imageRef" -}}
{{- $image := index . 0 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (toString (default (index . 1) $image.tag)) }}
{{- end }}
{{- end }}

{{/* The injected sidecar's image values: inject.sidecar.image, its empty fields from image.*. */}}
{{- define "dlq-sidecar-injector.sidecarImage" -}}
{{- $own := .Values.image }}
{{- $s := .Values.inject.sidecar.image }}
{{- $same := or (not $s.repository) (eq $s.repository $own.repository) }}
repository: {{ default $own.repository $s.repository | quote }}
tag: {{ default (default .Chart.AppVersion $own.tag) $s.tag | quote }}
digest: {{ default (ternary $own.digest "" $same) $s.digest | quote }}
pullPolicy: {{ $s.pullPolicy }}
{{- end }}

{{/* DNS names and IP addresses the serving certificate covers: the Service, and webhook.url's host. */}}
{{- define "dlq-sidecar-injector.certNames" -}}
{{- $svc := include "dlq-sidecar-injector.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $ips := list }}
{{- with .Values.webhook.url }}
{{- $host := (urlParse .).host | splitList ":" | first }}
{{- if regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$" $host }}
{{- $ips = append $ips $host }}
{{- else }}
{{- $dns = append $dns $host }}
{{- end }}
{{- end }}
{{- toYaml (dict "dns" $dns "ips" $ips) }}
{{- end }}
