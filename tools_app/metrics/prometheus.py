"""`/metrics` in the Prometheus text format: the running totals every process writes
(tools_app.core.counters, table MetricTotal) and the gauges read now (gauges.py), collected when
scraped, so every web worker and cluster process is in one answer and a restart loses nothing.

Why not prometheus-client's multiprocess mode: its per-process files aggregate the processes
of one machine only, start from zero when the files are cleared at a restart, and hold no
per-tenant figures for the dashboard; the database holds all three, and the counts are written
in batches already. prometheus-client still writes the text format (a custom collector).

Every name below is a contract with dashboards and alert rules (deploy/prometheus/alerts.yml,
the Grafana dashboard in deploy/grafana/, docs/observability.md). Label sets that are known in
advance (each write tool, each long tool's steps, ...) are present at zero before anything
happens, so a rule sees 0 rather than nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric as MetricFamily

from tools_app.core import counters, jobs
from tools_app.core.counters import Metric
from tools_app.core.models import MetricTotal
from tools_app.incidents.models import PauseScope
from tools_app.metrics import gauges, processes
from tools_app.toolkit.registry import ToolSpec, all_tools

RECONCILIATION_RESULTS = ("succeeded", "failed", "unknown")
UNDECLARED = "undeclared"  # the breakers of downstreams no tool declared, as one series
# [count, sum, buckets]: what a (tool, label) summed to.
Row = list[Any]


def _totals() -> dict[str, dict[tuple[str, str], Row]]:
    """metric -> (tool, label) -> [count, sum, buckets], summed over tenants."""
    summed: dict[str, dict[tuple[str, str], Row]] = defaultdict(dict)
    for metric, tool, label, count, total, buckets in MetricTotal.objects.values_list(
            "metric", "tool", "label", "count", "sum", "buckets"):
        row = summed[metric].setdefault((tool, label), [0, 0.0, None])
        row[0] += count
        row[1] += total
        if buckets is not None:
            row[2] = list(buckets) if row[2] is None else [a + b for a, b in zip(row[2], buckets, strict=True)]
    return summed


def _histogram_buckets(metric: Metric, counts: list[int] | None) -> list[tuple[str, float]]:
    bounds = metric.buckets or ()  # a histogram's: it has them
    counts = counts or [0] * (len(bounds) + 1)
    cumulative: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip([*map(_bound, bounds), "+Inf"], counts, strict=True):
        running += n
        cumulative.append((bound, running))
    return cumulative


def _bound(value: float) -> str:
    return format(value, "g")


def _counter(name: str, doc: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]
             ) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


class Collector:
    """Reads the database when scraped (prometheus_client calls `collect`)."""

    def collect(self) -> Iterator[MetricFamily]:
        totals = _totals()
        tools = all_tools()
        writes = [spec.name for spec in tools if spec.writes]
        downstream = [spec.name for spec in tools if spec.writes and not spec.transactional]
        long_tools = [spec for spec in tools if spec.pipeline is not None]

        def per(metric: Metric, zero: Iterable[tuple[str, str]] = ()) -> dict[tuple[str, str], Row]:
            rows = {key: [0, 0.0, None] for key in zero}
            rows.update(totals.get(metric.name, {}))
            return rows

        calls = per(counters.TOOL_CALL)
        yield _counter("idemops_tool_calls", "MCP tool calls by tool and outcome (replayed: answered from the "
                       "idempotency store).", ["tool", "outcome"],
                       ((key, row[0]) for key, row in sorted(calls.items())))
        seconds = HistogramMetricFamily("idemops_tool_call_seconds", "Duration of MCP tool calls by tool and outcome "
                                        "(replay latency: outcome=\"replayed\").", labels=["tool", "outcome"])
        for key, (_, total, buckets) in sorted(calls.items()):
            seconds.add_metric(list(key), _histogram_buckets(counters.TOOL_CALL, buckets), total)
        yield seconds
        yield _counter("idemops_processing_timeouts", "Executors' leases that ran out before they recorded an "
                       "outcome (the record went UNKNOWN).", ["tool"],
                       (((tool,), row[0]) for (tool, _), row in sorted(
                           per(counters.PROCESSING_TIMEOUT, ((t, "") for t in writes)).items())))
        yield _counter("idemops_downstream_duplicates", "Downstream answers that deduplicated our key (it had "
                       "acted already) or refused it reused for another request.", ["tool"],
                       (((tool,), row[0]) for (tool, _), row in sorted(
                           per(counters.DOWNSTREAM_DUPLICATE, ((t, "") for t in downstream)).items())))
        yield _counter("idemops_reconciliations", "Reconciliations of UNKNOWN records by tool and result "
                       "(succeeded, failed: settled; unknown: asked, still unknown).", ["tool", "result"],
                       ((key, row[0]) for key, row in sorted(per(counters.RECONCILIATION, (
                           (t, r) for t in downstream for r in RECONCILIATION_RESULTS)).items())))
        steps = HistogramMetricFamily("idemops_task_step_seconds", "Duration of task step runs by tool and step.",
                                      labels=["tool", "step"])
        for key, (_, total, buckets) in sorted(per(counters.TASK_STEP, (
                (spec.name, step.name) for spec in long_tools for step in spec.pipeline.steps)).items()):
            steps.add_metric(list(key), _histogram_buckets(counters.TASK_STEP, buckets), total)
        yield steps
        yield _counter("idemops_task_lease_expiries", "Task workers that died holding the task's lease.", ["tool"],
                       (((tool,), row[0]) for (tool, _), row in sorted(
                           per(counters.TASK_LEASE_EXPIRY, ((s.name, "") for s in long_tools)).items())))
        delivered = per(counters.OUTBOX_DELIVERY, [("", "")])
        lag = HistogramMetricFamily("idemops_outbox_delivery_lag_seconds", "Time from an outbox event's write to "
                                    "its delivery.", labels=[])
        lag.add_metric([], _histogram_buckets(counters.OUTBOX_DELIVERY, _summed_buckets(delivered.values())),
                       sum(row[1] for row in delivered.values()))
        yield lag
        yield _counter("idemops_process_restarts", "Processes `manage.py serve` started again after they died.",
                       ["process"], (((label,), row[0]) for (_, label), row in sorted(
                           per(counters.PROCESS_RESTART).items())))
        yield _counter("idemops_task_jobs_lost", "Queued tasks whose job was lost (it failed, or its cluster died "
                       "holding it), queued again by the sweep.", ["tool"],
                       (((tool,), row[0]) for (tool, _), row in sorted(
                           per(counters.TASK_JOB_LOST, ((s.name, "") for s in long_tools)).items())))
        yield from self._jobs()
        yield processes.build_info()
        yield from processes.process_figures(processes.this_machines_processes())
        yield from self._gauges(writes, long_tools, [spec.name for spec in tools if spec.approval is not None])
        yield from self._incidents({spec.downstream for spec in tools if spec.downstream})

    def _jobs(self) -> Iterator[MetricFamily]:
        queue = jobs.queue()
        queued = GaugeMetricFamily("idemops_jobs_queued", "django-q2 jobs in the queue: waiting for a cluster, or "
                                   "taken by one and not finished.", labels=["state"])
        queued.add_metric(["waiting"], queue.waiting)
        queued.add_metric(["taken"], queue.taken)
        yield queued
        yield GaugeMetricFamily("idemops_jobs_oldest_waiting_seconds", "How long the job waiting longest has "
                                "waited for a cluster (0: none waits).",
                                value=gauges.now_age(queue.oldest_waiting))
        yield GaugeMetricFamily("idemops_job_clusters", "Job clusters alive now, by their heartbeats (django-q2's, "
                                "in the shared cache: every machine's).", value=len(jobs.live_clusters()))

    def _gauges(self, writes: list[str], long_tools: list[ToolSpec], approval_tools: list[str]
                ) -> Iterator[MetricFamily]:
        now = gauges.now()
        unknown = GaugeMetricFamily("idemops_unknown_records", "Records in UNKNOWN now, being reconciled or "
                                    "waiting for a person.", labels=["tool"])
        overrun = GaugeMetricFamily("idemops_overrun_leases", "Records PROCESSING past their lease now (the "
                                    "executor died or hangs; the sweep will take them).", labels=["tool"])
        for tool in sorted(set(writes) | set(now.unknown) | set(now.overrun)):
            unknown.add_metric([tool], now.unknown.get(tool, 0))
            overrun.add_metric([tool], now.overrun.get(tool, 0))
        yield unknown
        yield overrun
        tasks = GaugeMetricFamily("idemops_tasks", "Unfinished tasks by tool and status.", labels=["tool", "status"])
        keys = {(spec.name, status) for spec in long_tools for status in gauges.LIVE_TASK_STATUSES} | set(now.tasks)
        for tool, status in sorted(keys):
            tasks.add_metric([tool, status], now.tasks.get((tool, status), 0))
        yield tasks
        outbox = GaugeMetricFamily("idemops_outbox_events", "Outbox events by status (dead: dead-lettered, waiting "
                                   "for an operator).", labels=["status"])
        for status in ("pending", "delivered", "dead"):
            outbox.add_metric([status], now.outbox.get(status, 0))
        yield outbox
        yield GaugeMetricFamily("idemops_outbox_oldest_pending_seconds", "Age of the oldest outbox event not "
                                "delivered yet (0: none).", value=now.age(now.outbox_oldest_pending) or 0)
        waiting = GaugeMetricFamily("idemops_approvals_waiting", "Approval requests waiting for a person.",
                                    labels=["tool"])
        oldest = GaugeMetricFamily("idemops_approvals_oldest_waiting_seconds", "Age of the oldest approval request "
                                   "waiting, per tool (0: none).", labels=["tool"])
        for tool in sorted(set(approval_tools) | set(now.approvals_waiting)):
            waiting.add_metric([tool], now.approvals_waiting.get(tool, 0))
            oldest.add_metric([tool], now.age(now.approvals_oldest.get(tool)) or 0)
        yield waiting
        yield oldest

    def _incidents(self, declared: set[str]) -> Iterator[MetricFamily]:
        now = gauges.incidents_now()
        open_ = GaugeMetricFamily("idemops_downstream_breaker_open", "1 while a downstream system's circuit breaker "
                                  "holds its calls back (open, or one call probing), else 0; downstreams no tool "
                                  "declared together as \"undeclared\".", labels=["downstream"])
        # A declared name is the registry's; a breaker known only by a URL's host (a tool that declared no
        # downstream) is not named in a label: hosts are unbounded, and may be a tenant's own endpoint.
        for downstream in sorted(declared):
            open_.add_metric([downstream], 1 if now.holding(downstream) else 0)
        undeclared = set(now.breakers) - declared
        open_.add_metric([UNDECLARED], 1 if any(now.holding(name) for name in undeclared) else 0)
        yield open_
        pauses = GaugeMetricFamily("idemops_pauses", "Operators' pauses standing, by scope (tool, downstream, "
                                   "tenant: which tenant is not said).", labels=["scope"])
        for scope in PauseScope.values:
            pauses.add_metric([scope], now.pauses.get(scope, 0))
        yield pauses


def _summed_buckets(rows: Iterable[Row]) -> list[int] | None:
    summed: list[int] | None = None
    for _, _, buckets in rows:
        if buckets is not None:
            summed = list(buckets) if summed is None else [a + b for a, b in zip(summed, buckets, strict=True)]
    return summed


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(Collector())


def exposition(accept: str = "") -> tuple[bytes, str]:
    """What a scrape gets, and its content type: the format its Accept header asks for (OpenMetrics),
    else Prometheus' text format 0.0.4, which every Prometheus reads."""
    encoder, content_type = choose_encoder(accept)
    return encoder(REGISTRY), content_type
