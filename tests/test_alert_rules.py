"""The shipped Prometheus rules (docs/prometheus/alerts.yml): well formed, every series
they read is one /metrics exports, and promtool accepts them where it is installed."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from queue_app.web.metrics import render_metrics

RULES = Path(__file__).resolve().parent.parent / "docs/prometheus/alerts.yml"


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_every_rule_names_an_alert_with_a_wait_a_severity_and_a_summary():
    found = rules()
    names = [rule["alert"] for rule in found]
    assert len(names) == len(set(names)) >= 6
    for rule in found:
        assert rule["expr"].strip() and re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info") and rule["annotations"]["summary"]
    # what the issue asks to alert on
    assert {"RSQNoLiveWorker", "RSQProviderPausedWithWork", "RSQOldestWaitOverThreshold", "RSQFailureRate"} <= set(names)
    assert {"RSQDetachedTasksUnchecked", "RSQBudgetUsedUp"} <= set(names)


@pytest.mark.django_db
def test_every_series_the_rules_read_is_exported():
    exported = {family.name for family in text_string_to_metric_families(render_metrics().decode())}
    exported |= {name + "_total" for name in exported}  # a counter's samples end in _total
    for rule in rules():
        expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", "", rule["expr"])
        names = {word for word in re.findall(r"\b(rsq_\w+)", expr)}
        assert names and names <= exported, (rule["alert"], names - exported)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_the_rules():
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)")
def test_the_rules_fire_on_what_they_name_and_not_on_a_clean_restart():
    """alerts_test.yml: a paused provider's growing wait and its pause fire; lost and
    interrupted attempts do not make a failure rate; a worker outage with work fires."""
    tests = RULES.with_name("alerts_test.yml")
    result = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
