"""deploy/grafana/idemcount.json asks only for metrics a real node's /metrics serves, and (where
Debian's ``promtool`` is installed) its queries parse and /metrics passes ``promtool check
metrics``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cluster_util import Client, running_cluster, wait_until

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "idemcount.json"
METRIC = re.compile(r"\b(idc_[A-Za-z0-9_]+)")
# what Grafana substitutes before a query reaches Prometheus
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$instance": ".*"}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _queries(dash: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in _panels(dash["panels"]) for t in p.get("targets", [])]
    out += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def _served(text: str) -> set[str]:
    """Names of the samples in a text exposition (``x_bucket``, ``x_count``, ... included)."""
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def _promql(query: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        query = query.replace(var, value)
    return query


def test_the_dashboard_is_importable_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in _panels(dash["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in _panels(dash["panels"]):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p["targets"] and all(METRIC.search(t["expr"]) for t in p["targets"]), p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]), p["title"]
    titles = " ".join(p["title"].lower() for p in _panels(dash["panels"]))
    for topic in ("ops", "latency", "false-positive", "fill", "in-doubt", "anti-entropy",
                  "members", "loop lag"):
        assert topic in titles, topic


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian: apt-get install prometheus)")
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    queries = _queries(json.loads(DASHBOARD.read_text()))
    rules = tmp_path / "rules.yml"
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, q in enumerate(q for q in queries if not q.startswith("label_values(")):
        lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(_promql(q))}"]
    rules.write_text("\n".join(lines) + "\n")
    done = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(120)
async def test_every_metric_the_dashboard_uses_is_served(tmp_path: Path) -> None:
    wanted = {m for q in _queries(json.loads(DASHBOARD.read_text())) for m in METRIC.findall(q)}
    assert len(wanted) >= 40, sorted(wanted)  # the dashboard covers the node's metrics
    client = Client()
    try:
        async with running_cluster(3, rf=3, data_dir=tmp_path) as cluster:
            urls = cluster.urls
            # what makes the per-table, per-route and per-peer series appear
            for i, url in enumerate(urls):
                status, body = await client.add(url, "likes", f"post-{i}", f"app-1:{i}", 1)
                assert status == 200 and body == {"applied": True}, body
            status, body = await client.add(urls[1], "likes", "post-0", "app-1:0", 1)  # a retry
            assert status == 200 and body.get("duplicate") is True, body
            status, _ = await client.batch(urls[0], [
                {"table": "likes", "key": "post-9", "op_id": "app-1:9", "delta": 2}])
            assert status == 200
            assert await client.value(urls[2], "likes", "post-0", "quorum") == 1
            texts: dict[str, str] = {}

            async def all_served() -> bool:
                for url in urls:
                    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
                        texts[url] = await r.text()
                return all(wanted <= _served(t) for t in texts.values())

            try:
                await wait_until(all_served, timeout=20, what="every metric on every node")
            except AssertionError:
                missing = {u: sorted(wanted - _served(t)) for u, t in texts.items()}
                raise AssertionError(f"the dashboard uses metrics /metrics does not serve: "
                                     f"{missing}") from None
    finally:
        await client.close()
    if shutil.which("promtool") is not None:  # Debian's prometheus package
        for url, text in texts.items():
            done = subprocess.run(["promtool", "check", "metrics"], input=text,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{url}: {done.stdout}{done.stderr}"
