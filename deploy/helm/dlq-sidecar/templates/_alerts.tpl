{{/*
The alert rules (`groups:` of a Prometheus rule file), shared by templates/prometheusrule.yaml and the
plain rules file deploy/prometheus/dlq-sidecar-rules.yaml (that file is this template rendered with
`prometheusRule.scope: all`; tests/integration/test_monitoring.py checks they agree). Every alert
carries `namespace`, `pod` and `topic` labels: per-pod conditions are joined with
dlq_sidecar_source_topic_info, one alert per source topic of the pod.
*/}}

{{/* PromQL label matchers `{a,b}` from a list of matcher strings (empty ones dropped); "" for none. */}}
{{- define "dlq-sidecar.promSel" -}}
{{- $parts := compact . -}}
{{- if $parts }}{{ printf "{%s}" (join "," $parts) }}{{ end -}}
{{- end }}

{{/* A per-pod condition, one series per (namespace, pod, topic) of the pod's source topics. */}}
{{- define "dlq-sidecar.perTopic" -}}
{{- $sel := index . 0 -}}
{{- $cond := index . 1 -}}
max by (namespace, pod, topic) (dlq_sidecar_source_topic_info{{ include "dlq-sidecar.promSel" (list $sel) }} * on (namespace, pod) group_left () max by (namespace, pod) ({{ $cond }}))
{{- end }}

{{- define "dlq-sidecar.alertGroups" -}}
{{- $r := .Values.prometheusRule }}
{{- $t := $r.thresholds }}
{{- $s := "" }}
{{- if eq $r.scope "release" }}
{{- $s = printf "namespace=%q,service=%q" .Release.Namespace (include "dlq-sidecar.fullname" .) }}
{{- end }}
{{- $book := $r.runbookUrl }}
groups:
  - name: dlq-sidecar
    rules:
      - alert: DlqSidecarDlqWriteFailing
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "increase(dlq_sidecar_dlq_failed_total%s[10m]) > 0 or dlq_sidecar_readiness_check%s == 0" (include "dlq-sidecar.promSel" (list $s)) (include "dlq-sidecar.promSel" (list $s `check="dlq_writable"`)))) }}
        for: {{ $t.dlqFailingFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: DLQ writes are failing (source topic {{ $labels.topic }})'`}}
          description: >-
            A DLQ write failed for good, or the DLQ is not writable: the sidecar stops rather than lose
            the record, and delivery of the source topic stops with it.
          runbook_url: {{ printf "%s#dlqsidecardlqwritefailing" $book }}
      - alert: DlqSidecarDeadLetterRateHigh
        expr: >-
          sum by (namespace, pod, topic) (rate(dlq_sidecar_dead_lettered_total{{ include "dlq-sidecar.promSel" (list $s) }}[5m])) > {{ $t.deadLetterRatePerSecond }}
        for: {{ $t.deadLetterFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: {{ $value | humanize }} DLQ records/s from topic {{ $labels.topic }}'`}}
          description: >-
            More records of the source topic go to the DLQ per second than
            prometheusRule.thresholds.deadLetterRatePerSecond ({{ $t.deadLetterRatePerSecond }}).
          runbook_url: {{ printf "%s#dlqsidecardeadletterratehigh" $book }}
      - alert: DlqSidecarDeadLetterRatioHigh
        expr: >-
          sum by (namespace, pod, topic) (rate(dlq_sidecar_dead_lettered_total{{ include "dlq-sidecar.promSel" (list $s) }}[10m])) / sum by (namespace, pod, topic) (rate(dlq_sidecar_records_delivered_total{{ include "dlq-sidecar.promSel" (list $s) }}[10m])) > {{ $t.deadLetterRatio }}
        for: {{ $t.deadLetterFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: {{ $value | humanizePercentage }} of the records of topic {{ $labels.topic }} go to the DLQ'`}}
          description: >-
            DLQ records per answered record above prometheusRule.thresholds.deadLetterRatio
            ({{ $t.deadLetterRatio }}).
          runbook_url: {{ printf "%s#dlqsidecardeadletterratiohigh" $book }}
      - alert: DlqSidecarCircuitBreakerOpen
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_circuit_breaker_state%s == 0" (include "dlq-sidecar.promSel" (list $s `state="closed"`)))) }}
        for: {{ $t.breakerOpenFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the DLQ circuit breaker is not closed (source topic {{ $labels.topic }})'`}}
          description: >-
            Records that would be dead-lettered are held and redelivered instead; the pod is not ready.
          runbook_url: {{ printf "%s#dlqsidecarcircuitbreakeropen" $book }}
      - alert: DlqSidecarCommitsStalled
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_commits_failing_seconds%s > %v" (include "dlq-sidecar.promSel" (list $s)) $t.commitsFailingSeconds)) }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: every offset commit has failed for {{ $value | humanizeDuration }} (source topic {{ $labels.topic }})'`}}
          description: >-
            Nothing is handed out or marked done while commits fail (consumer engine); past
            commit.stall.timeout.ms /healthz fails and the kubelet restarts the sidecar.
          runbook_url: {{ printf "%s#dlqsidecarcommitsstalled" $book }}
      - alert: DlqSidecarAppUnreachable
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_app_reachable%s == 0" (include "dlq-sidecar.promSel" (list $s)))) }}
        for: {{ $t.appUnreachableFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the app does not accept connections (source topic {{ $labels.topic }})'`}}
          description: >-
            The sidecar cannot connect to the app: intake is paused and records wait in Kafka.
          runbook_url: {{ printf "%s#dlqsidecarappunreachable" $book }}
      {{- $commitLag := printf "dlq_sidecar_commit_lag_records%s" (include "dlq-sidecar.promSel" (list $s)) }}
      {{- $shareLag := printf "min by (namespace, job, topic, partition) (dlq_sidecar_share_lag_records%s)" (include "dlq-sidecar.promSel" (list $s)) }}
      - alert: DlqSidecarLagGrowing
        expr: >-
          (sum by (namespace, pod, topic) (deriv({{ $commitLag }}[10m])) > 0 and sum by (namespace, pod, topic) ({{ $commitLag }}) > {{ $t.lagMinRecords }}) or (sum by (namespace, job, topic) (deriv(({{ $shareLag }})[10m:1m])) > 0 and sum by (namespace, job, topic) ({{ $shareLag }}) > {{ $t.lagMinRecords }})
        for: {{ $t.lagGrowingFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ if $labels.pod }}{{ $labels.pod }}{{ else }}{{ $labels.job }} (share group){{ end }}: lag of topic {{ $labels.topic }} keeps growing'`}}
          description: >-
            The lag has grown for prometheusRule.thresholds.lagGrowingFor ({{ $t.lagGrowingFor }}) and is
            above {{ $t.lagMinRecords }} records: the consumers do not keep up. Consumer engine: per pod;
            share engine: per share group (the pods behind one Service, `job`), from the smallest of the
            pods' estimates per partition.
          runbook_url: {{ printf "%s#dlqsidecarlaggrowing" $book }}
      - alert: DlqSidecarIsolationPassLong
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_isolation_active%s == 1" (include "dlq-sidecar.promSel" (list $s)))) }}
        for: {{ $t.isolationPassFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: an isolation pass has run long (source topic {{ $labels.topic }})'`}}
          description: >-
            After an unclean stop the suspects are delivered one at a time; throughput is low until the
            pass ends.
          runbook_url: {{ printf "%s#dlqsidecarisolationpasslong" $book }}
      - alert: DlqSidecarNotReady
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_ready%s == 0" (include "dlq-sidecar.promSel" (list $s)))) }}
        for: {{ $t.notReadyFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the sidecar is not ready (source topic {{ $labels.topic }})'`}}
          description: >-
            /readyz answers 503: a readiness check fails (dlq_sidecar_readiness_check says which).
          runbook_url: {{ printf "%s#dlqsidecarnotready" $book }}
      - alert: DlqSidecarBrokerArchivedWithoutDlq
        expr: >-
          sum by (namespace, pod, topic) (increase(dlq_sidecar_broker_archived_without_dlq_total{{ include "dlq-sidecar.promSel" (list $s) }}[15m])) > 0
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the broker archived records of topic {{ $labels.topic }} with no DLQ record'`}}
          description: >-
            Share engine: records were released on their last delivery and the broker archived them
            itself; they are in no DLQ.
          runbook_url: {{ printf "%s#dlqsidecarbrokerarchivedwithoutdlq" $book }}
{{- end }}
