"""The `process_*` figures (CPU seconds, memory, open files, start time) of each idemops process of
this machine, and what was built: `idemops_build_info`.

A web process answers the scrape with its own figures and those of the job clusters on its machine:
the clusters serve no HTTP, but their heartbeats (core.jobs.live_clusters) name their processes,
and /proc has the figures. Each series is labelled with the process's role and pid, so a worker
that grows or spins is seen as itself. prometheus-client's ProcessCollector reads /proc (on Linux;
elsewhere it yields nothing); we only relabel what it reads.
"""

from __future__ import annotations

import os
import platform
import socket
import tomllib
from collections.abc import Callable, Iterator
from functools import cache
from importlib import metadata
from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric as MetricFamily

from tools_app.core import jobs

LABELS = ["process", "pid"]


def this_machines_processes() -> list[tuple[str, int]]:
    """(role, pid) of the process answering and of the job clusters' processes on this machine."""
    found = [("web", os.getpid())]
    host = socket.gethostname()
    for cluster in jobs.live_clusters():
        if cluster.host == host:
            found += [("jobs", cluster.pid), ("jobs-sentinel", cluster.sentinel), ("jobs-monitor", cluster.monitor),
                      ("jobs-pusher", cluster.pusher), *(("jobs-worker", pid) for pid in cluster.workers)]
    return [(role, pid) for role, pid in found if pid]


def process_figures(processes: list[tuple[str, int]]) -> Iterator[MetricFamily]:
    families: dict[str, MetricFamily] = {}
    for role, pid in processes:
        for read in ProcessCollector(namespace="", pid=_constant(pid), registry=None).collect():
            family = families.get(read.name)
            if family is None:
                family = families[read.name] = MetricFamily(read.name, read.documentation, read.type, read.unit)
            for sample in read.samples:
                family.add_sample(sample.name, {**sample.labels, "process": role, "pid": str(pid)}, sample.value)
    yield from families.values()


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


@cache
def version() -> str:
    try:
        return metadata.version("idemops")
    except metadata.PackageNotFoundError:  # run from a checkout: its pyproject.toml says
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> GaugeMetricFamily:
    info = GaugeMetricFamily("idemops_build_info", "What this process runs (always 1).",
                             labels=["version", "python", "django", "django_q", "mcp"])
    info.add_metric([version(), platform.python_version(), _installed("django"), _installed("django-q2"),
                     _installed("mcp")], 1)
    return info
