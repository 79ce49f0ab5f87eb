"""What Prometheus and kube-state-metrics would have recorded of a pod on the test node, replayed through promtool.

:class:`Recording` samples, once per scrape interval, the sidecar's ``/metrics`` (through a relay to the pod's
IP; a failed scrape is ``up`` 0 and stale series, as Prometheus writes them; target labels ``namespace``,
``pod``, ``job``, ``service`` added) and the sidecar container's status from the API, as kube-state-metrics
exports it (restarts, waiting reason, last terminated reason). :func:`replay` writes the samples as a
``promtool test rules`` group against the plain rule file, deploy/prometheus/dlq-sidecar-rules.yaml (without
its annotations), every alert not listed at an evaluation time expected silent then.
"""

from __future__ import annotations

import http.client
import math
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.integration.test_alert_rules import run_promtool
from tests.integration.test_promtool_rules import alert_names, completed, without_annotations
from tests.kubecluster import KubeCluster
from tests.promtext import prometheus_values

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "dlq-sidecar-rules.yaml"
SCRAPE_INTERVAL_S = 5
SCRAPE_TIMEOUT_S = 2.0
KSM = "kube_pod_init_container_status"  # the native sidecar is an init container
Obj = dict[str, Any]


def rule_metrics() -> set[str]:
    """The metric names the rules' expressions read."""
    exprs = " ".join(
        str(rule["expr"])
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    )
    return set(re.findall(r"\b(dlq_sidecar_\w+|kube_\w+)\b", exprs))


@dataclass
class Sample:
    slot: int  # the scrape's index: its time is slot * SCRAPE_INTERVAL_S from the first
    series: dict[str, float]  # what this scrape and kube-state-metrics gave, target labels included
    up: bool
    container: Obj  # the sidecar's status in the pod


def _with_labels(series: str, labels: dict[str, str]) -> str:
    name, _, rest = series.partition("{")
    inner = rest.rstrip("}")
    added = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner + ',' if inner else ''}{added}}}"


class Recording:
    """The scrapes of one pod's sidecar (its /metrics at ``address``) and of its status, one per interval."""

    def __init__(
        self, cluster: KubeCluster, pod: Obj, address: str, job: str, container: str = "dlq-sidecar"
    ) -> None:
        meta = pod["metadata"]
        self.cluster = cluster
        self.path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        self.address = address
        self.container = container
        self.target = {"namespace": meta["namespace"], "pod": meta["name"]}
        self.job = job
        self.samples: list[Sample] = []
        self.wanted = rule_metrics()
        self._start = time.monotonic()

    def _scrape(self) -> dict[str, float] | None:
        try:
            with urllib.request.urlopen(
                f"http://{self.address}/metrics", timeout=SCRAPE_TIMEOUT_S
            ) as answer:
                text = answer.read().decode()
        except (OSError, http.client.HTTPException):
            return None
        target = {**self.target, "job": self.job, "service": self.job}
        return {
            _with_labels(series, target): value
            for series, value in prometheus_values(text).items()
            if series.partition("{")[0] in self.wanted
        }

    def _status(self) -> Obj:
        status = self.cluster.get(self.path).get("status", {})
        for found in status.get("initContainerStatuses", []):
            if found["name"] == self.container:
                return dict(found)
        raise AssertionError(f"no status of {self.container}: {status}")

    def _kube_state(self, status: Obj) -> dict[str, float]:
        labels = {**self.target, "container": self.container, "job": "kube-state-metrics"}
        found = {_with_labels(f"{KSM}_restarts_total", labels): float(status["restartCount"])}
        waiting = status.get("state", {}).get("waiting", {}).get("reason")
        if waiting:
            found[_with_labels(f"{KSM}_waiting_reason", {**labels, "reason": waiting})] = 1.0
        last = status.get("lastState", {}).get("terminated", {}).get("reason")
        if last:
            found[_with_labels(f"{KSM}_last_terminated_reason", {**labels, "reason": last})] = 1.0
        return found

    def sample(self) -> Sample:
        """One scrape at the next interval's tick (the first at once; a tick already past is skipped: no
        sample then)."""
        slot = 0
        if self.samples:
            due = math.ceil((time.monotonic() - self._start) / SCRAPE_INTERVAL_S - 0.01)
            slot = max(self.samples[-1].slot + 1, due)
        time.sleep(max(0.0, self._start + slot * SCRAPE_INTERVAL_S - time.monotonic()))
        scraped = self._scrape()
        status = self._status()
        series = {**(scraped or {}), **self._kube_state(status)}
        sample = Sample(slot, series, scraped is not None, status)
        self.samples.append(sample)
        return sample

    def until(self, done: Callable[[Sample], bool], timeout_s: float, what: str) -> Sample:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sample = self.sample()
            if done(sample):
                return sample
        last = self.samples[-1] if self.samples else None
        raise AssertionError(
            f"timed out after {timeout_s:g} s waiting for {what}; last: {last and last.container}"
        )

    def input_series(self) -> list[dict[str, str]]:
        """The samples as promtool's input series: one value per interval, `stale` once a series is
        gone, `_` where no scrape was taken."""
        by_slot = {s.slot: s for s in self.samples}
        names = sorted({name for s in self.samples for name in s.series})
        up = _with_labels("up", {**self.target, "job": self.job, "service": self.job})
        rows = []
        for name in [up, *names]:
            values: list[str] = []
            seen = False
            for slot in range(self.samples[-1].slot + 1):
                sample = by_slot.get(slot)
                value = None if sample is None else sample.series.get(name)
                if name == up and sample is not None:
                    value = 1.0 if sample.up else 0.0
                if sample is None:
                    values.append("_")
                elif value is None or not math.isfinite(value):
                    values.append("stale" if seen else "_")
                else:
                    values.append(format(value, ".17g"))
                    seen = True
            rows.append({"series": name, "values": " ".join(values)})
        return rows

    @staticmethod
    def at(sample: Sample) -> str:
        return f"{sample.slot * SCRAPE_INTERVAL_S}s"


def replay(promtool: str, recording: Recording, checks: list[Obj], where: Path) -> str:
    """promtool's output for ``checks`` (alert_rule_test items) on the recording; fails when promtool does."""
    spec = yaml.safe_load(RULES.read_text())
    where.mkdir(parents=True, exist_ok=True)
    (where / "rules.yaml").write_text(yaml.safe_dump(without_annotations(spec), sort_keys=False))
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        "tests": [
            {
                "name": "recorded on the node",
                "interval": f"{SCRAPE_INTERVAL_S}s",
                "input_series": recording.input_series(),
                "alert_rule_test": checks,
            }
        ],
    }
    path = where / "recorded.yaml"
    path.write_text(yaml.safe_dump(completed(doc, alert_names(spec)), sort_keys=False))
    proc = run_promtool(promtool, "test", "rules", str(path))
    assert proc.returncode == 0, f"{path}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout
