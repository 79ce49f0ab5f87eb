{{/*
Helpers of the dlq-sidecar chart.

Two kinds of helpers live here:
  * name/label helpers that take the chart's root context (`.`), as in the `helm create` scaffold;
  * sidecar helpers that take a dict `(dict "root" $ "values" <values>)`, where <values> has this
    chart's values shape (`sidecar`, `app`, ...). This chart passes its own `.Values`; a team whose own
    chart depends on this one passes `(index .Values "dlq-sidecar")`, which Helm has already merged
    with this chart's defaults. These helpers are the public surface for other charts:
      dlq-sidecar.container       the native-sidecar container (a list item for `initContainers:`)
      dlq-sidecar.volumes         its volumes (list items for `volumes:`)
      dlq-sidecar.appEnv          env items for the app container (sidecar URL, socket path)
      dlq-sidecar.appVolumeMounts volume mounts for the app container (the socket directory)
      dlq-sidecar.configMap       the ConfigMap holding config.yaml
      dlq-sidecar.configChecksum  value for the pod's `checksum/config` annotation
      dlq-sidecar.terminationGracePeriodSeconds
*/}}

{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "dlq-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name. The release name is used alone when it already contains the chart name.
*/}}
{{- define "dlq-sidecar.fullname" -}}
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

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "dlq-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "dlq-sidecar.labels" -}}
helm.sh/chart: {{ include "dlq-sidecar.chart" . }}
{{ include "dlq-sidecar.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never add the version here. */}}
{{- define "dlq-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dlq-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The console's labels: a name of its own, so the workload's selectors never match its pods. */}}
{{- define "dlq-sidecar.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-console" (include "dlq-sidecar.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: console
{{- end }}

{{- define "dlq-sidecar.consoleLabels" -}}
helm.sh/chart: {{ include "dlq-sidecar.chart" . }}
{{ include "dlq-sidecar.consoleSelectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Name of the ServiceAccount to use. */}}
{{- define "dlq-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dlq-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; $default is the tag when tag is empty. */}}
{{- define "dlq-sidecar.imageRef" -}}
{{- $image := index . 0 }}
{{- $default := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (toString (default $default $image.tag)) }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------
Sidecar helpers: take (dict "root" $ "values" <values>).
--------------------------------------------------------------------------------------------- */}}

{{/* Directory of the shared emptyDir that holds the app's Unix socket. */}}
{{- define "dlq-sidecar.socketDir" -}}
/var/run/dlq-sidecar
{{- end }}

{{/* Where the ConfigMap is mounted; the CLI reads config.yaml from here. */}}
{{- define "dlq-sidecar.configDir" -}}
/etc/dlq-sidecar
{{- end }}

{{/* Where the Kafka TLS Secret is mounted (not under the read-only ConfigMap mount). */}}
{{- define "dlq-sidecar.tlsDir" -}}
/etc/dlq-sidecar-tls
{{- end }}

{{- define "dlq-sidecar.configMapName" -}}
{{- printf "%s-sidecar" (include "dlq-sidecar.fullname" .root) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The drain timeout in milliseconds, as an integer. */}}
{{- define "dlq-sidecar.drainTimeoutMs" -}}
{{- int64 .values.sidecar.shutdown.drainTimeoutMs }}
{{- end }}

{{/*
terminationGracePeriodSeconds. On pod deletion Kubernetes stops the app first and the native
sidecar only after the app has exited, and both must fit in one grace period: the app's own
shutdown, then the sidecar's drain, then a margin. An explicit value must still exceed the drain
timeout, or kubelet would SIGKILL the sidecar mid-drain.
*/}}
{{- define "dlq-sidecar.terminationGracePeriodSeconds" -}}
{{- $v := .values }}
{{- $drainS := div (add (int64 $v.sidecar.shutdown.drainTimeoutMs) 999) 1000 }}
{{- if not (kindIs "invalid" $v.terminationGracePeriodSeconds) }}
{{- $explicit := int64 $v.terminationGracePeriodSeconds }}
{{- if le $explicit $drainS }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be above the sidecar's drain timeout (%d s)" $explicit $drainS) }}
{{- end }}
{{- $explicit }}
{{- else }}
{{- add (int64 $v.app.shutdownSeconds) $drainS (int64 $v.sidecar.shutdown.marginSeconds) }}
{{- end }}
{{- end }}

{{/*
Fails when the free-form config sets a key the chart derives from structured values: two sources
for one setting would drift apart (e.g. a listen port the probes do not use).
*/}}
{{- define "dlq-sidecar.checkOwnedKeys" -}}
{{- $cfg := .values.sidecar.config }}
{{- /* The keys without which the sidecar cannot start: fail at render time, not in a crash loop. */}}
{{- $kafkaCfg := get $cfg "kafka" | default dict }}
{{- $sourceCfg := get $cfg "source" | default dict }}
{{- if not (and (kindIs "map" $kafkaCfg) (get $kafkaCfg "bootstrap.servers") (get $kafkaCfg "group.id")) }}
{{- fail "sidecar.config.kafka needs bootstrap.servers and group.id" }}
{{- end }}
{{- if not (and (kindIs "map" $sourceCfg) (get $sourceCfg "topics")) }}
{{- fail "sidecar.config.source.topics is required (the topics to consume)" }}
{{- end }}
{{- /* Containers of a pod share one network namespace: the sidecar's ports must be free in the app. */}}
{{- $apiPort := int64 .values.sidecar.api.port }}
{{- $obsPort := int64 .values.sidecar.api.observabilityPort }}
{{- $appPorts := list }}
{{- if eq .values.app.transport "tcp" }}
{{- $appPorts = append $appPorts (int64 .values.app.port) }}
{{- end }}
{{- range .values.app.ports }}
{{- $appPorts = append $appPorts (int64 .containerPort) }}
{{- end }}
{{- if has $apiPort $appPorts }}
{{- fail (printf "sidecar.api.port %d is also an app port: the containers share the pod's network namespace" $apiPort) }}
{{- end }}
{{- if and (eq .values.sidecar.api.exposure "pod") (has $obsPort $appPorts) }}
{{- fail (printf "sidecar.api.observabilityPort %d is also an app port: the containers share the pod's network namespace" $obsPort) }}
{{- end }}
{{- if eq $apiPort $obsPort }}
{{- fail "sidecar.api.observabilityPort must differ from sidecar.api.port (the control API)" }}
{{- end }}
{{- $owned := dict "api" (list "listen" "observability.listen" "token" "allow.non.loopback") "app" (list "url" "unix_socket") }}
{{- range $section, $keys := $owned }}
{{- $sub := get $cfg $section }}
{{- if kindIs "map" $sub }}
{{- range $keys }}
{{- if hasKey $sub . }}
{{- fail (printf "sidecar.config.%s.%s is set by the chart from structured values (sidecar.api.* / app.*); remove it" $section .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey $cfg "shutdown.drain.timeout.ms" }}
{{- fail "sidecar.config.shutdown.drain.timeout.ms is set by the chart: use sidecar.shutdown.drainTimeoutMs" }}
{{- end }}
{{- $kafka := get $cfg "kafka" }}
{{- if and (kindIs "map" $kafka) (or .values.sidecar.kafka.sasl.enabled .values.sidecar.kafka.tls.enabled) }}
{{- range (list "security.protocol" "sasl.mechanism" "sasl.mechanisms" "sasl.username" "sasl.password" "ssl.ca.location" "ssl.certificate.location" "ssl.key.location") }}
{{- if hasKey $kafka . }}
{{- fail (printf "sidecar.config.kafka.%s is set by the chart when sidecar.kafka.sasl/tls is enabled; remove it" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The chart-derived part of the config, as a dict merged over sidecar.config. */}}
{{- define "dlq-sidecar.ownedConfig" -}}
{{- $v := .values }}
{{- $port := int64 $v.sidecar.api.port }}
{{- /* The control API (acks, status) never listens on the pod IP. */}}
{{- $api := dict "listen" (printf "127.0.0.1:%d" $port) }}
{{- if eq $v.sidecar.api.exposure "pod" }}
{{- /* kubelet HTTP probes and Prometheus connect to the pod IP: the read-only listener. */}}
{{- $_ := set $api "observability.listen" (printf "0.0.0.0:%d" (int64 $v.sidecar.api.observabilityPort)) }}
{{- end }}
{{- if $v.sidecar.api.token.existingSecret }}
{{- $_ := set $api "token" "${DLQ_SIDECAR_API_TOKEN}" }}
{{- end }}
{{- $app := dict }}
{{- if eq $v.app.transport "pull" }}
{{- /* Pull mode: nothing connects to the app; it pulls from the control API ($DLQ_SIDECAR_URL). */}}
{{- $app = dict "mode" "pull" }}
{{- else if eq $v.app.transport "unix" }}
{{- $app = dict "url" (printf "http://localhost%s" $v.app.pushPath) "unix_socket" (printf "%s/%s" (include "dlq-sidecar.socketDir" .) $v.app.socketName) }}
{{- else }}
{{- $app = dict "url" (printf "http://127.0.0.1:%d%s" (int64 $v.app.port) $v.app.pushPath) }}
{{- end }}
{{- $owned := dict "api" $api "app" $app "shutdown.drain.timeout.ms" (int64 $v.sidecar.shutdown.drainTimeoutMs) }}
{{- $kafka := dict }}
{{- $sasl := $v.sidecar.kafka.sasl }}
{{- $tls := $v.sidecar.kafka.tls }}
{{- if $sasl.enabled }}
{{- $_ := set $kafka "security.protocol" (ternary "SASL_SSL" "SASL_PLAINTEXT" $tls.enabled) }}
{{- $_ := set $kafka "sasl.mechanism" $sasl.mechanism }}
{{- /* The sidecar substitutes ${ENV} at start-up; the values come from the Secret via env. */}}
{{- $_ := set $kafka "sasl.username" "${DLQ_KAFKA_SASL_USERNAME}" }}
{{- $_ := set $kafka "sasl.password" "${DLQ_KAFKA_SASL_PASSWORD}" }}
{{- else if $tls.enabled }}
{{- $_ := set $kafka "security.protocol" "SSL" }}
{{- end }}
{{- if and $tls.enabled $tls.existingSecret }}
{{- $dir := include "dlq-sidecar.tlsDir" . }}
{{- $_ := set $kafka "ssl.ca.location" (printf "%s/%s" $dir $tls.caKey) }}
{{- if $tls.certKey }}
{{- $_ := set $kafka "ssl.certificate.location" (printf "%s/%s" $dir $tls.certKey) }}
{{- $_ := set $kafka "ssl.key.location" (printf "%s/%s" $dir $tls.keyKey) }}
{{- end }}
{{- end }}
{{- if $kafka }}
{{- $_ := set $owned "kafka" $kafka }}
{{- end }}
{{- toYaml $owned }}
{{- end }}

{{/* The sidecar's config.yaml: sidecar.config with the chart-derived keys merged over it. */}}
{{- define "dlq-sidecar.config" -}}
{{- include "dlq-sidecar.checkOwnedKeys" . }}
{{- $cfg := deepCopy (default (dict) .values.sidecar.config) }}
{{- /* engine: share counts deaths in a journal on the /tmp emptyDir (survives container restarts). */}}
{{- if not (hasKey $cfg "share.journal.path") }}{{ $_ := set $cfg "share.journal.path" "/tmp/share-journal" }}{{ end }}
{{- /* The exit record on the same emptyDir: a fatal exit shows in the next process's metrics. */}}
{{- $metrics := default (dict) (index $cfg "metrics") }}
{{- if not (hasKey $metrics "exit.record.path") }}{{ $_ := set $metrics "exit.record.path" "/tmp/exit-record" }}{{ end }}
{{- $_ := set $cfg "metrics" $metrics }}
{{- $owned := include "dlq-sidecar.ownedConfig" . | fromYaml }}
{{- toYaml (mergeOverwrite $cfg $owned) }}
{{- end }}

{{/* sha256 of config.yaml, for the pod's checksum/config annotation (rolls pods on change). */}}
{{- define "dlq-sidecar.configChecksum" -}}
{{- include "dlq-sidecar.config" . | sha256sum }}
{{- end }}

{{- define "dlq-sidecar.configMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "dlq-sidecar.configMapName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "dlq-sidecar.labels" .root | nindent 4 }}
    app.kubernetes.io/component: dlq-sidecar
data:
  config.yaml: |
    {{- include "dlq-sidecar.config" . | nindent 4 }}
{{- end }}

{{/*
A probe: HTTP GET on the observability port, or (exposure: loopback) an exec of python inside the
image against the control API on loopback (its /healthz and /readyz need no token).
*/}}
{{- define "dlq-sidecar.probe" -}}
{{- $v := .ctx.values }}
{{- $p := .probe -}}
{{- if eq $v.sidecar.api.exposure "pod" }}
httpGet:
  path: {{ .path }}
  port: sidecar-obs
{{- else }}
exec:
  command:
    - python
    - -c
    - {{ printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d%s', timeout=%d)" (int64 $v.sidecar.api.port) .path (int64 $p.timeoutSeconds) | quote }}
{{- end }}
periodSeconds: {{ $p.periodSeconds }}
failureThreshold: {{ $p.failureThreshold }}
timeoutSeconds: {{ $p.timeoutSeconds }}
{{- end }}

{{/*
The sidecar container, as a list item for `initContainers:`. restartPolicy: Always makes it a
native sidecar: it starts (and passes its startup probe) before the app containers start, and is
stopped only after they have exited, so the app never loses the sidecar mid-request.
*/}}
{{- define "dlq-sidecar.container" -}}
{{- $v := .values }}
{{- $s := $v.sidecar -}}
- name: dlq-sidecar
  image: {{ include "dlq-sidecar.imageRef" (list $s.image .root.Chart.AppVersion) | quote }}
  imagePullPolicy: {{ $s.image.pullPolicy }}
  restartPolicy: Always
  args:
    - run
    - -c
    - {{ include "dlq-sidecar.configDir" . }}/config.yaml
  {{- if eq $s.api.exposure "pod" }}
  ports:
    {{- /* Only the read-only listener: the control API on 127.0.0.1 is no container port. */}}
    - name: sidecar-obs
      containerPort: {{ $s.api.observabilityPort }}
      protocol: TCP
  {{- end }}
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- if $s.kafka.sasl.enabled }}
    - name: DLQ_KAFKA_SASL_USERNAME
      valueFrom:
        secretKeyRef:
          name: {{ required "sidecar.kafka.sasl.existingSecret is required when SASL is enabled" $s.kafka.sasl.existingSecret }}
          key: {{ $s.kafka.sasl.usernameKey }}
    - name: DLQ_KAFKA_SASL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ $s.kafka.sasl.existingSecret }}
          key: {{ $s.kafka.sasl.passwordKey }}
    {{- end }}
    {{- if $s.api.token.existingSecret }}
    - name: DLQ_SIDECAR_API_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $s.api.token.existingSecret }}
          key: {{ $s.api.token.key }}
    {{- end }}
    {{- range $s.secretEnv }}
    - name: {{ .name }}
      valueFrom:
        secretKeyRef:
          name: {{ .secretName }}
          key: {{ .key }}
    {{- end }}
    {{- with $s.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $s.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $s.startupProbe.enabled }}
  startupProbe:
    {{- include "dlq-sidecar.probe" (dict "ctx" . "path" "/healthz" "probe" $s.startupProbe) | trim | nindent 4 }}
  {{- end }}
  {{- if $s.livenessProbe.enabled }}
  livenessProbe:
    {{- include "dlq-sidecar.probe" (dict "ctx" . "path" "/healthz" "probe" $s.livenessProbe) | trim | nindent 4 }}
  {{- end }}
  {{- if $s.readinessProbe.enabled }}
  readinessProbe:
    {{- include "dlq-sidecar.probe" (dict "ctx" . "path" "/readyz" "probe" $s.readinessProbe) | trim | nindent 4 }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $s.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: dlq-sidecar-config
      mountPath: {{ include "dlq-sidecar.configDir" . }}
      readOnly: true
    - name: dlq-sidecar-tmp
      mountPath: /tmp
    {{- if eq $v.app.transport "unix" }}
    - name: dlq-sidecar-socket
      mountPath: {{ include "dlq-sidecar.socketDir" . }}
    {{- end }}
    {{- if and $s.kafka.tls.enabled $s.kafka.tls.existingSecret }}
    - name: dlq-sidecar-kafka-tls
      mountPath: {{ include "dlq-sidecar.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- with $s.volumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The sidecar's volumes, as list items for `volumes:`. */}}
{{- define "dlq-sidecar.volumes" -}}
{{- $s := .values.sidecar -}}
- name: dlq-sidecar-config
  configMap:
    name: {{ include "dlq-sidecar.configMapName" . }}
- name: dlq-sidecar-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if eq .values.app.transport "unix" }}
- name: dlq-sidecar-socket
  emptyDir:
    sizeLimit: 1Mi
{{- end }}
{{- if and $s.kafka.tls.enabled $s.kafka.tls.existingSecret }}
- name: dlq-sidecar-kafka-tls
  secret:
    secretName: {{ $s.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* Env items for the app container: where the sidecar's control API is, its token, where to listen. */}}
{{- define "dlq-sidecar.appEnv" -}}
- name: DLQ_SIDECAR_URL
  value: {{ printf "http://127.0.0.1:%d" (int64 .values.sidecar.api.port) | quote }}
{{- with .values.sidecar.api.token }}
{{- if .existingSecret }}
- name: DLQ_SIDECAR_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- if eq .values.app.transport "unix" }}
- name: DLQ_SIDECAR_APP_SOCKET
  value: {{ printf "%s/%s" (include "dlq-sidecar.socketDir" .) .values.app.socketName | quote }}
{{- else if eq .values.app.transport "tcp" }}
- name: DLQ_SIDECAR_APP_PORT
  value: {{ .values.app.port | quote }}
{{- end }}
{{- end }}

{{/* Volume mounts for the app container: the shared socket directory (transport: unix). */}}
{{- define "dlq-sidecar.appVolumeMounts" -}}
{{- if eq .values.app.transport "unix" }}
- name: dlq-sidecar-socket
  mountPath: {{ include "dlq-sidecar.socketDir" . }}
{{- end }}
{{- end }}
