"""deploy/: the alert rules fire when they should (promtool's own unit tests), the scrape configuration
is one Prometheus accepts, and every metric the rules and the Grafana dashboard use is one idemops serves.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tools_app.metrics.prometheus import Collector

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "idemops.json"
SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool not installed (Debian's prometheus package; .ci/run installs it)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_the_alert_rules_pass_promtools_check_and_their_unit_tests():
    checked = promtool("check", "rules", "alerts.yml", cwd=PROMETHEUS)
    tested = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_the_scrape_configuration_is_one_prometheus_accepts(tmp_path):
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(PROMETHEUS / name, tmp_path / name)
    (tmp_path / "idemops-metrics-token").write_text("a-token\n")

    checked = promtool("check", "config", "prometheus.yml", cwd=tmp_path)

    assert checked.returncode == 0, checked.stdout + checked.stderr


def served_names() -> set[str]:
    return {family.name + suffix for family in Collector().collect() for suffix in SUFFIXES[family.type]}


def test_every_metric_the_alerts_and_the_dashboard_use_is_served(db):
    used = set(re.findall(r"idemops_[a-z_]+", (PROMETHEUS / "alerts.yml").read_text()))
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used |= {name for query in queries for name in re.findall(r"idemops_[a-z_]+", query)}

    assert used - served_names() == set()
    assert {alert for alert in re.findall(r"alert: (\w+)", (PROMETHEUS / "alerts.yml").read_text())} == {
        "IdemopsUnknownOutcomes", "IdemopsProcessingTimeouts", "IdemopsDeadLetteredEvents",
        "IdemopsApprovalsWaitingTooLong", "IdemopsOutboxLagging", "IdemopsTaskWorkersDying",
        "IdemopsNoJobClusterAlive", "IdemopsJobsWaitingTooLong", "IdemopsProcessesRestarting",
        "IdemopsCircuitBreakerOpen"}


def test_every_runbook_url_of_an_alert_leads_to_a_section_of_the_runbook():
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    sections = {re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
                for title in re.findall(r"^## (.+)$", runbook, flags=re.MULTILINE)}
    alerts = (PROMETHEUS / "alerts.yml").read_text()
    urls = re.findall(r'runbook_url: "([^"]+)"', alerts)

    assert len(urls) == len(re.findall(r"alert: (\w+)", alerts))  # one for each alert
    assert {url.split("#")[0] for url in urls} == {"https://github.com/idemops/idemops/blob/main/docs/runbook.md"}
    assert {url.split("#")[1] for url in urls} <= sections
    tested = (PROMETHEUS / "alerts_test.yml").read_text()
    assert all(tested.count(url) >= 1 for url in urls)  # each alert with a runbook has a promtool test that fires it


SAMPLES = ROOT / "deploy"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (systemd)")
def test_the_systemd_units_are_ones_systemd_accepts():
    units = sorted((SAMPLES / "systemd").glob("idemops-*"))
    checked = subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True,
                             timeout=60)

    # The target host's paths (/srv/idemops/.venv/bin/...) are not this machine's: all else must pass.
    problems = [line for line in (checked.stdout + checked.stderr).splitlines() if "is not executable" not in line]
    assert {unit.name for unit in units} >= {"idemops-web.service", "idemops-jobs@.service"}
    assert problems == []


def test_every_supervisor_sample_runs_the_processes_and_probes_the_web_process_as_it_serves(db):
    import yaml
    from django.test import Client

    from tools_app.management.commands.serve import Command

    manifests = list(yaml.safe_load_all((SAMPLES / "kubernetes" / "idemops.yaml").read_text()))
    containers = {c["name"]: c for m in manifests if m["kind"] in ("Deployment", "Job")
                  for c in m["spec"]["template"]["spec"]["containers"]}
    web = containers["web"]
    probes = {kind: web[kind]["httpGet"]["path"] for kind in ("livenessProbe", "readinessProbe")}
    procfile = dict(line.split(": ", 1) for line in (SAMPLES / "Procfile").read_text().splitlines()
                    if line and not line.startswith("#"))
    units = {path.name: path.read_text() for path in (SAMPLES / "systemd").glob("idemops-*")}

    # the liveness probe asks no database (an outage must not restart every pod), readiness does
    assert probes == {"livenessProbe": "/livez", "readinessProbe": "/readyz"}
    assert Client().get(probes["livenessProbe"]).status_code == 200
    assert Client().get(probes["readinessProbe"]).json()["checks"]["database"]["ok"] is True
    assert "/livez" in units["idemops-web-liveness.service"]
    # each runs what `serve` runs: granian with the ASGI app (workers respawned), and qcluster
    served = Command.web_argv("127.0.0.1", 8000, 1)
    for web_command in (web["command"], procfile["web"].split(), units["idemops-web.service"].split()):
        assert "idemops.asgi:application" in web_command and "--respawn-failed-workers" in web_command
        assert {"--respawn-failed-workers", "idemops.asgi:application"} <= set(served)
    assert containers["jobs"]["command"] == ["idemops", "qcluster"] and procfile["jobs"] == "idemops qcluster"
    assert "ExecStart=/srv/idemops/.venv/bin/idemops qcluster" in units["idemops-jobs@.service"]
    assert containers["migrate"]["command"][:2] == ["idemops", "migrate"]
    # the jobs pods (the purge runs there) write the audit archives, their events' only copy, to one shared volume
    jobs = next(m for m in manifests if m["metadata"]["name"] == "idemops-jobs")["spec"]["template"]["spec"]
    archive_dir = {e["name"]: e["value"] for e in containers["jobs"]["env"]}["IDEMOPS_AUDIT_ARCHIVE_DIR"]
    (mount,) = [m for m in containers["jobs"]["volumeMounts"] if m["mountPath"] == archive_dir]
    (volume,) = [v for v in jobs["volumes"] if v["name"] == mount["name"]]
    claim = next(m for m in manifests if m["kind"] == "PersistentVolumeClaim"
                 and m["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
