{{/*
The alert rules (`groups:` of a Prometheus rule file), shared by templates/prometheusrule.yaml and the
plain rules file deploy/prometheus/dlq-sidecar-rules.yaml (that file is this template rendered with
`prometheusRule.scope: all`; tests/integration/test_helm_monitoring.py checks they agree, and
tests/promtool/*.yaml replay the failure modes through `promtool test rules`). A per-pod alert
carries `namespace`, `pod` and `topic` labels: its condition is joined with
dlq_sidecar_source_topic_info, one alert per source topic of the pod. The conditions that outlive
the process (down, restarting, a fatal exit) join with the last value of that series within a day,
since a target that is down has no series now.
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

{{/* The same, with the topics the pod exported within the last day (its series are gone while it is down). */}}
{{- define "dlq-sidecar.perTopicRecent" -}}
{{- $sel := index . 0 -}}
{{- $cond := index . 1 -}}
max by (namespace, pod, topic) (last_over_time(dlq_sidecar_source_topic_info{{ include "dlq-sidecar.promSel" (list $sel) }}[1d]) * on (namespace, pod) group_left () max by (namespace, pod) ({{ $cond }}))
{{- end }}

{{/* A Prometheus duration (`90s`, `1m30s`, `2m`) in seconds, as a float. */}}
{{- define "dlq-sidecar.seconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0 "y" 31536000.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 }}
{{- $n := regexFind "^[0-9]+" . }}
{{- $total = addf $total (mulf (float64 $n) (get $units (trimPrefix $n .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Render-time checks: thresholds that cannot work with the sidecar's own timeouts fail the render.
The kubelet's crash-loop back-off reaches 300 s; a DLQ write fails for good only after
`errors.deadletterqueue.produce.retries.timeout.ms`.
*/}}
{{- define "dlq-sidecar.checkAlertThresholds" -}}
{{- $r := .Values.prometheusRule }}
{{- $t := $r.thresholds }}
{{- $cfg := default (dict) .Values.sidecar.config }}
{{- $url := toString $r.runbookUrl }}
{{- if not $url }}
{{- fail "prometheusRule.runbookUrl is required: the absolute URL where docs/runbook.md is served (e.g. https://git.example.com/dlq-sidecar/-/blob/main/docs/runbook.md); each alert's runbook_url is it plus #<alert name>" }}
{{- end }}
{{- if and (not (regexMatch "^https?://[^/?#]+" $url)) (not $r.allowRelativeRunbookUrl) }}
{{- fail (printf "prometheusRule.runbookUrl %q is not an absolute http(s) URL: a pager cannot open a relative link (set prometheusRule.allowRelativeRunbookUrl: true to keep it)" $url) }}
{{- end }}
{{- if and (eq $r.scope "release") (not .Values.serviceMonitor.enabled) }}
{{- fail "prometheusRule.scope release selects the namespace and service labels of the chart's ServiceMonitor: enable serviceMonitor.enabled, or set prometheusRule.scope all (every dlq-sidecar the Prometheus scrapes); otherwise no rule matches any series and DlqSidecarAbsent fires for ever" }}
{{- end }}
{{- $engine := default "consumer" (index $cfg "engine") }}
{{- $stallMs := index $cfg "commit.stall.timeout.ms" | default 300000 }}
{{- if hasKey $cfg "commit.stall.timeout.ms" }}{{ $stallMs = index $cfg "commit.stall.timeout.ms" }}{{ end }}
{{- $scrape := include "dlq-sidecar.seconds" .Values.serviceMonitor.interval | float64 }}
{{- $stalled := float64 $t.commitsFailingSeconds }}
{{- if and (ne $engine "share") (gt (float64 $stallMs) 0.0) (ge (mulf (addf $stalled $scrape) 1000.0) (float64 $stallMs)) }}
{{- fail (printf "prometheusRule.thresholds.commitsFailingSeconds (%v s) plus a scrape (serviceMonitor.interval %s) must stay below commit.stall.timeout.ms (%v ms): at that timeout the liveness probe restarts the sidecar, dlq_sidecar_commits_failing_seconds starts at 0 again and DlqSidecarCommitsStalled would never fire" $t.commitsFailingSeconds .Values.serviceMonitor.interval $stallMs) }}
{{- end }}
{{- $produceMs := index $cfg "errors.deadletterqueue.produce.retries.timeout.ms" | default 120000 }}
{{- $between := addf 300.0 (divf (float64 $produceMs) 1000.0) $scrape }}
{{- $window := include "dlq-sidecar.seconds" $t.fatalExitWindow | float64 }}
{{- if le $window $between }}
{{- fail (printf "prometheusRule.thresholds.fatalExitWindow (%s) must be longer than the time between two fatal exits of a crash-looping sidecar (%v s: the kubelet's 300 s back-off, errors.deadletterqueue.produce.retries.timeout.ms and a scrape), or DlqSidecarDlqWriteFailing resolves between them" $t.fatalExitWindow $between) }}
{{- end }}
{{- $restartsWindow := include "dlq-sidecar.seconds" $t.restartsWindow | float64 }}
{{- if lt $restartsWindow (mulf (float64 $t.restarts) 300.0) }}
{{- fail (printf "prometheusRule.thresholds.restartsWindow (%s) must hold prometheusRule.thresholds.restarts (%v) restarts at the kubelet's 300 s crash-loop back-off (at least %v s), or a steady crash loop never reaches the count" $t.restartsWindow $t.restarts (mulf (float64 $t.restarts) 300.0)) }}
{{- end }}
{{- end }}

{{- define "dlq-sidecar.alertGroups" -}}
{{- include "dlq-sidecar.checkAlertThresholds" . }}
{{- $r := .Values.prometheusRule }}
{{- $t := $r.thresholds }}
{{- $full := include "dlq-sidecar.fullname" . }}
{{- $s := "" }}
{{- $ksm := `container="dlq-sidecar"` }}
{{- if eq $r.scope "release" }}
{{- $s = printf "namespace=%q,service=%q" .Release.Namespace $full }}
{{- $ksm = printf "namespace=%q,pod=~%q,container=\"dlq-sidecar\"" .Release.Namespace (printf "%s-[a-z0-9]+-[a-z0-9]+" $full) }}
{{- end }}
{{- $book := $r.runbookUrl }}
{{- $win := $t.fatalExitWindow }}
{{- $winS := include "dlq-sidecar.seconds" $win | float64 }}
{{- $sel := include "dlq-sidecar.promSel" (list $s) }}
{{- /* A fatal exit for a DLQ reason within the window (from the exit record: it survives the restart). */}}
{{- $dlqExit := printf "time() - max by (namespace, pod) (max_over_time(dlq_sidecar_last_fatal_exit_timestamp_seconds%s[%s]) > 0) < %v" (include "dlq-sidecar.promSel" (list $s `reason=~"dlq_write_failed|dlq_startup_failed"`)) $win $winS }}
{{- $rw := $t.restartsWindow }}
{{- $rwS := include "dlq-sidecar.seconds" $rw | float64 }}
{{- $dlqReasons := `reason=~"dlq_write_failed|dlq_startup_failed"` }}
{{- /* Restarts within restartsWindow, whatever their cause: the sidecar's own count (the exit record), kube-state-metrics' (native sidecar or plain container), or a crash-loop back-off. */}}
{{- $ownRestarts := printf "sum by (namespace, pod) (increase(dlq_sidecar_restarts_total%s[%s]))" $sel $rw }}
{{- $ksmRestarts := printf "max by (namespace, pod) (increase(kube_pod_init_container_status_restarts_total{%s}[%s]) or increase(kube_pod_container_status_restarts_total{%s}[%s])) >= %v or max by (namespace, pod) (max_over_time(kube_pod_init_container_status_waiting_reason{%s,reason=\"CrashLoopBackOff\"}[%s])) == 1" $ksm $rw $ksm $rw $t.restarts $ksm $rw }}
{{- $restarts := printf "%s >= %v or %s" $ownRestarts $t.restarts $ksmRestarts }}
{{- /* The restarts a DLQ failure does not explain: the own count minus the DLQ fatal exits the exit record counts; kube-state-metrics' count only when no DLQ fatal exit falls in the window. */}}
{{- $dlqExits := printf "sum by (namespace, pod) (increase(dlq_sidecar_fatal_exits_total%s[%s]))" (include "dlq-sidecar.promSel" (list $s $dlqReasons)) $rw }}
{{- $dlqExitInWindow := printf "time() - max by (namespace, pod) (max_over_time(dlq_sidecar_last_fatal_exit_timestamp_seconds%s[%s]) > 0) < %v" (include "dlq-sidecar.promSel" (list $s $dlqReasons)) $rw $rwS }}
{{- $otherRestarts := printf "%s - (%s or %s * 0) >= %v or ((%s) unless on (namespace, pod) (%s))" $ownRestarts $dlqExits $ownRestarts $t.restarts $ksmRestarts $dlqExitInWindow }}
{{- $brokerDown := printf "dlq_sidecar_readiness_check%s == 0" (include "dlq-sidecar.promSel" (list $s `check="broker_reachable"`)) }}
groups:
  - name: dlq-sidecar
    rules:
      - alert: DlqSidecarDown
        expr: >-
          max by (namespace, pod, topic) (last_over_time(dlq_sidecar_source_topic_info{{ $sel }}[1d]) * on (namespace, pod, job) group_left () (max by (namespace, pod, job) (up{{ $sel }} == 0) unless on (namespace, pod) ({{ $restarts }})))
        for: {{ $t.downFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the sidecar does not answer its scrapes (source topic {{ $labels.topic }})'`}}
          description: >-
            Prometheus cannot scrape the sidecar's /metrics (`up` 0) and it is not restarting: the
            process hangs, or the container is gone and not coming back. Delivery of the pod's
            partitions has stopped.
          runbook_url: {{ printf "%s#dlqsidecardown" $book }}
      {{- if eq $r.scope "release" }}
      - alert: DlqSidecarAbsent
        expr: >-
          absent(up{{ $sel }}) unless on () (max(kube_deployment_spec_replicas{namespace={{ .Release.Namespace | quote }},deployment={{ $full | quote }}}) == 0)
        for: {{ $t.absentFor }}
        labels:
          severity: critical
        annotations:
          summary: {{ printf "'%s/%s: Prometheus scrapes no dlq-sidecar of this release'" .Release.Namespace $full }}
          description: >-
            No target of the release's ServiceMonitor exists (no pod, no endpoint, or the
            ServiceMonitor is not selected by this Prometheus), and the Deployment is not scaled to 0:
            nothing consumes the source topics, and no other alert can fire.
          runbook_url: {{ printf "%s#dlqsidecarabsent" $book }}
      {{- end }}
      - alert: DlqSidecarRestarting
        expr: >-
          {{ include "dlq-sidecar.perTopicRecent" (list $s $otherRestarts) }} or (max by (namespace, pod) ({{ $ksmRestarts }}) unless on (namespace, pod) last_over_time(dlq_sidecar_source_topic_info{{ $sel }}[1d]))
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the sidecar keeps restarting{{ if $labels.topic }} (source topic {{ $labels.topic }}){{ else }}, never scraped{{ end }}'`}}
          description: >-
            The sidecar container restarted {{ $t.restarts }} times within {{ $t.restartsWindow }} (or is in
            CrashLoopBackOff), not because of a DLQ write (that is DlqSidecarDlqWriteFailing): an OOM
            kill, a liveness restart (commits stalled), a runtime failure (exit 1). Delivery stops while
            it is down. With no `topic` label the sidecar was never scraped (kube-state-metrics' counts
            only): a memory limit below its idle footprint, or a failure at start-up.
          runbook_url: {{ printf "%s#dlqsidecarrestarting" $book }}
      - alert: DlqSidecarDlqWriteFailing
        expr: >-
          {{ include "dlq-sidecar.perTopicRecent" (list $s (printf "increase(dlq_sidecar_dlq_failed_total%s[10m]) > 0 or (dlq_sidecar_readiness_check%s == 0 unless on (namespace, pod) %s) or %s" $sel (include "dlq-sidecar.promSel" (list $s `check="dlq_writable"`)) $brokerDown $dlqExit)) }}
        for: {{ $t.dlqFailingFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: DLQ writes are failing (source topic {{ $labels.topic }})'`}}
          description: >-
            A DLQ write failed for good, or the DLQ is not writable with the broker reachable, or the
            sidecar exited for a DLQ write or its DLQ start-up check within {{ $win }} (the exit record:
            dlq_sidecar_last_fatal_exit_timestamp_seconds): the sidecar stops rather than lose the
            record, and delivery of the source topic stops with it.
          runbook_url: {{ printf "%s#dlqsidecardlqwritefailing" $book }}
      - alert: DlqSidecarBrokerUnreachable
        expr: >-
          {{ include "dlq-sidecar.perTopicRecent" (list $s (printf "max_over_time(dlq_sidecar_readiness_check%s[2m]) == 0" (include "dlq-sidecar.promSel" (list $s `check="broker_reachable"`)))) }}
        for: {{ $t.brokerUnreachableFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the sidecar cannot use the Kafka cluster (source topic {{ $labels.topic }})'`}}
          description: >-
            The readiness check broker_reachable fails (through the restart a stall of the commits
            causes: the window bridges its missed scrape): no broker answers, or the cluster refuses the
            sidecar's credentials or certificates. Nothing is consumed or dead-lettered meanwhile.
          runbook_url: {{ printf "%s#dlqsidecarbrokerunreachable" $book }}
      - alert: DlqSidecarDeadLetterRateHigh
        expr: >-
          sum by (namespace, pod, topic) (rate(dlq_sidecar_dead_lettered_total{{ $sel }}[5m])) > {{ $t.deadLetterRatePerSecond }}
        for: {{ $t.deadLetterFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: {{ $value | humanize }} DLQ records/s from topic {{ $labels.topic }}'`}}
          description: >-
            More records of the source topic go to the DLQ per second than
            prometheusRule.thresholds.deadLetterRatePerSecond ({{ $t.deadLetterRatePerSecond }}).
          runbook_url: {{ printf "%s#dlqsidecardeadletterratehigh" $book }}
      {{- $finished := printf "sum by (namespace, pod, topic) (increase(dlq_sidecar_records_delivered_total%s[10m]) or increase(dlq_sidecar_dead_lettered_total%s[10m]))" (include "dlq-sidecar.promSel" (list $s `outcome="accept"`)) $sel }}
      - alert: DlqSidecarDeadLetterRatioHigh
        expr: >-
          (sum by (namespace, pod, topic) (increase(dlq_sidecar_dead_lettered_total{{ $sel }}[10m])) / {{ $finished }} > {{ $t.deadLetterRatio }}) and {{ $finished }} >= {{ $t.deadLetterRatioMinRecords }}
        for: {{ $t.deadLetterFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: {{ $value | humanizePercentage }} of the records of topic {{ $labels.topic }} go to the DLQ'`}}
          description: >-
            DLQ records per finished record (accepted or dead-lettered; releases are not an end) above
            prometheusRule.thresholds.deadLetterRatio ({{ $t.deadLetterRatio }}) over 10 minutes, with at
            least {{ $t.deadLetterRatioMinRecords }} records finished (deadLetterRatioMinRecords).
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
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_commits_failing_seconds%s > %v unless on (namespace, pod) %s" $sel $t.commitsFailingSeconds $brokerDown)) }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: every offset commit has failed for {{ $value | humanizeDuration }} (source topic {{ $labels.topic }})'`}}
          description: >-
            Nothing is handed out or marked done while commits fail (consumer engine) with the broker
            reachable (an unreachable one is DlqSidecarBrokerUnreachable); past commit.stall.timeout.ms
            /healthz fails and the kubelet restarts the sidecar (the chart refuses a threshold that
            the restart would always beat).
          runbook_url: {{ printf "%s#dlqsidecarcommitsstalled" $book }}
      - alert: DlqSidecarAppUnreachable
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_app_reachable%s == 0" $sel)) }}
        for: {{ $t.appUnreachableFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the app does not accept connections (source topic {{ $labels.topic }})'`}}
          description: >-
            The sidecar cannot connect to the app: intake is paused and records wait in Kafka.
          runbook_url: {{ printf "%s#dlqsidecarappunreachable" $book }}
      - alert: DlqSidecarAppRouteMissing
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_app_route_missing%s == 1" $sel)) }}
        for: {{ $t.appUnreachableFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the app has no route at the configured URL (source topic {{ $labels.topic }})'`}}
          description: >-
            The app answers the sidecar's requests with 404, 405 or 415 and no JSON answer: app.url
            names a path, method or content type the app does not serve. Intake is paused and records
            wait in Kafka, none counted or dead-lettered; /readyz names the URL and the status.
          runbook_url: {{ printf "%s#dlqsidecarapproutemissing" $book }}
      - alert: DlqSidecarSchemaRegistryUnreachable
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_readiness_check%s == 0" (include "dlq-sidecar.promSel" (list $s `check="schema_registry_reachable"`)))) }}
        for: {{ $t.schemaRegistryUnreachableFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the schema registry cannot be used (source topic {{ $labels.topic }})'`}}
          description: >-
            The sidecar cannot load the schemas of the records it decodes (schemas.decode): intake is
            paused, records wait in Kafka and none go to the DLQ for it.
          runbook_url: {{ printf "%s#dlqsidecarschemaregistryunreachable" $book }}
      {{- $commitLag := printf "dlq_sidecar_committed_lag_records%s" $sel }}
      {{- $shareLag := printf "min by (namespace, job, topic, partition) (dlq_sidecar_share_lag_records%s)" $sel }}
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
            above {{ $t.lagMinRecords }} records: the consumers do not keep up. Consumer engine: per pod,
            from the committed offset (dlq_sidecar_committed_lag_records: records the sidecar holds
            but has not finished count); share engine: per share group (the pods behind one Service,
            `job`), from the smallest of the pods' estimates per partition.
          runbook_url: {{ printf "%s#dlqsidecarlaggrowing" $book }}
      - alert: DlqSidecarIsolationPassLong
        expr: >-
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_isolation_active%s == 1" $sel)) }}
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
          {{ include "dlq-sidecar.perTopic" (list $s (printf "dlq_sidecar_readiness_check%s == 0" (include "dlq-sidecar.promSel" (list $s `check!~"assigned|subscribed|broker_reachable|app_reachable|app_route_found|dlq_writable|commits_ok|circuit_breaker_closed|schema_registry_reachable"`)))) }}
        for: {{ $t.notReadyFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the sidecar is not ready (source topic {{ $labels.topic }})'`}}
          description: >-
            /readyz answers 503 for a readiness check with no alert of its own (a check these rules do
            not know; dlq_sidecar_readiness_check says which). The known checks page through their
            cause's alert, and `assigned` (`subscribed` for a share group) not at all: an idle pod has no partitions.
          runbook_url: {{ printf "%s#dlqsidecarnotready" $book }}
      - alert: DlqSidecarBrokerArchivedWithoutDlq
        expr: >-
          max by (namespace, pod, topic) (max_over_time(dlq_sidecar_pod_broker_archived_without_dlq_total{{ $sel }}[10m]) or max_over_time(dlq_sidecar_broker_archived_without_dlq_total{{ $sel }}[10m])) > 0
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: the broker archived {{ $value }} records of topic {{ $labels.topic }} with no DLQ record'`}}
          description: >-
            Share engine: records were released on their last delivery and the broker archived them
            itself; they are in no DLQ. The alert stays while the pod lives (its exit record keeps the
            count across container restarts): it ends 10 minutes after the pods are replaced, once the
            group's share.delivery.count.limit is fixed.
          runbook_url: {{ printf "%s#dlqsidecarbrokerarchivedwithoutdlq" $book }}
      - alert: DlqSidecarDlqPayloadGone
        expr: >-
          max by (namespace, pod, topic) (increase(dlq_sidecar_dlq_source_deleted_total{{ $sel }}[1h])) > 0
        labels:
          severity: critical
        annotations:
          summary: {{`'{{ $labels.namespace }}/{{ $labels.pod }}: headers-only DLQ records of topic {{ $labels.topic }} lost their payload'`}}
          description: >-
            DLQ records written without a copy of the record (errors.deadletterqueue.copy.record.enable
            false, or a copy too large for the DLQ topic) point at their source offset, and retention or
            delete-records has deleted that offset: their payload is gone and they cannot be replayed.
            More go the same way unless the DLQ is replayed first or the source topic's retention is
            longer. Fires for an hour after each loss.
          runbook_url: {{ printf "%s#dlqsidecardlqpayloadgone" $book }}
{{- end }}
