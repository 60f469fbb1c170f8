"""The live status page in a real browser: headless Chromium (Debian's `chromium`, installed by
`make chromium`, which `make test` runs) loads `GET /` from the admin routes, the page fetches
/stats and /status.json, and the numbers it renders are checked against those endpoints, and those
against the truth: a lane tripped on purpose is open in the admin listener's /stats, in the data
listener's, and on the page; the spend table is the governance store's spend of the keyed calls
made. A screenshot is saved (docs/status-page.png is one)."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess

import pytest

from tests.conftest import CONFIG, PY, ROOT, env, free_port, stop, wait_http

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _get(port, path, token=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers={"authorization": "Bearer " + token} if token else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _post(port, model, token):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            {"content-type": "application/json", "authorization": "Bearer " + token})
        return c.getresponse().status
    finally:
        c.close()


def _mint(admin, **body):
    c = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
    try:
        c.request("POST", "/api/v1/admin/keys", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        out = json.loads(r.read())
        assert r.status == 201, out
        return out["token"]
    finally:
        c.close()


# The `failover` pool trips its first lane (dead-model, a closed port) on its first failure, so the
# lane is open (not merely cooling) for the ~30 s (15 s * 2^1) the page is looked at.
TRIP_FIRST = "  failover:\n    breaker: {trip: {mode: consecutive, consecutive_n: 1}}\n    members:"
# Every model of CONFIG priced (a rate card covers all or none): output 1000 units per Mtok.
CARD = "rate_card:\n" + "".join("  %s: {input_utok: 0.0, output_utok: 1000.0}\n" % m for m in (
    "oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model", "dead-model",
    "one-slot"))
GOVERNANCE = """\
auth:
  admin_auth: []
  chain: [keys]
  signing_key: {env: BB_SIGNING}
groups:
  team-a: {limits: [{requests: 1000, per: minute}]}
store: {module: memory}
""" + CARD
# Fields of /stats that are times counted down between two reads.
TICKING = ("cooldown_remaining_s", "recovery_hint_ms")


def _steady(stats):
    return {"pools": stats["pools"],
            "lanes": [{k: v for k, v in lane.items() if k not in TICKING} for lane in stats["lanes"]]}


def _group_spend(admin, group):
    """The group's keys' spend today, as the admin API's GET /usage prices it (micro-units)."""
    status, body = _get(admin, "/api/v1/admin/keys?group=%s" % group)
    assert status == 200, body
    ids = {k["id"] for k in json.loads(body)["items"]}
    status, body = _get(admin, "/api/v1/admin/usage")
    assert status == 200, body
    return round(sum(k["spend_micros"] for k in json.loads(body)["by_key"] if k["id"] in ids) / 1e6, 6)


def test_status_page_in_chromium(mock_port, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium is not installed and could not be: `make chromium` installs Debian's "
                    "chromium with apt-get (needs root or passwordless sudo)")
    port, admin = free_port(), free_port()
    cfg = tmp_path / "c.yaml"
    base = CONFIG.format(port=port, mock=mock_port, dead=free_port())
    assert base.count("  failover:\n    members:") == 1
    cfg.write_text(base.replace("  failover:\n    members:", TRIP_FIRST) + GOVERNANCE +
                   "export: {access: {module: access-log, settings: {path: \"off\"}}, metrics: "
                   "{module: prometheus, settings: {buffer_seconds: 60}}}\n"
                   'admin_listen: "127.0.0.1:%d"\n' % admin)
    e = env()
    e["BB_SIGNING"] = "ab" * 32
    proc = subprocess.Popen([PY, "-m", "busbar.cli", "serve", "--config", str(cfg), "--workers", "1"],
                            cwd=ROOT, env=e)
    try:
        wait_http(port, proc)
        wait_http(admin, proc, "/stats")
        team, loner = _mint(admin, name="a", group="team-a"), _mint(admin, name="b")
        for _ in range(12):
            assert _post(port, "mixed", team) == 200
        for _ in range(3):
            assert _post(port, "failover", loner) == 200
        assert _get(admin, "/")[0] == 200
        # Both listeners' /stats are one producer's: the tripped lane is open in each (the data
        # listener's behind a key, as every call there).
        on_admin = json.loads(_get(admin, "/stats")[1])
        assert _get(port, "/stats")[0] == 401
        on_data = json.loads(_get(port, "/stats", loner)[1])
        assert _steady(on_admin) == _steady(on_data)
        cell = {(l["pool"], l["model"]): l for l in on_admin["lanes"]}
        dead = cell[("failover", "dead-model")]
        assert (dead["breaker_state"], dead["availability"], dead["usable"]) == (
            "open", "breaker_open", False)
        assert dead["trips"] == 1 and dead["cooldown_remaining_s"] > 10
        assert cell[("failover", "ant-model")]["breaker_state"] == "closed"
        profile = tmp_path / "profile"
        common = [chromium, *FLAGS, "--user-data-dir=%s" % profile, "--virtual-time-budget=6000"]
        dom = subprocess.run(common + ["--dump-dom", "http://127.0.0.1:%d/" % admin],
                             capture_output=True, text=True, timeout=90).stdout
        assert 'data-renders="' in dom, dom[-2000:]
        stats = json.loads(_get(admin, "/stats")[1])
        summary = json.loads(_get(admin, "/status.json")[1])
        # The cells (pool, lane) and pools shown are /stats' own, with /stats' states.
        shown = re.findall(r'<tr data-cell="([^"]+)">', dom)
        assert shown == ["%s/%s" % (l["pool"], l["model"]) for l in stats["lanes"]]
        assert re.findall(r'<tr data-pool="([^"]+)">', dom) == list(stats["pools"])
        for lane in stats["lanes"]:
            row = re.search(r'<tr data-cell="%s/%s">(.*?)</tr>' % (
                re.escape(lane["pool"]), re.escape(lane["model"])), dom).group(1)
            assert '<td data-field="inflight">%d</td>' % lane["inflight"] in row
            assert 'data-field="breaker_state">%s</td>' % lane["breaker_state"] in row
            assert '<td data-field="availability">%s</td>' % lane["availability"] in row
            limit = "–" if lane["limit"] is None else str(lane["limit"])
            assert '<td data-field="limit">%s</td>' % limit in row
        row = re.search(r'<tr data-cell="failover/dead-model">(.*?)</tr>', dom).group(1)
        assert '<td class="open" data-field="breaker_state">open</td>' in row
        assert '<td data-field="availability">breaker_open</td>' in row
        # Spend by group: the store's, as the admin API's own usage reads it; keys without a
        # group have a row of their own.
        spend = {g["group"]: g["usd"] for g in summary["spend_by_group"]}
        assert set(spend) == {"team-a", None} and summary["spend_off"] is None
        assert round(spend["team-a"], 6) == _group_spend(admin, "team-a") > 0 and spend[None] > 0
        for group, usd in spend.items():
            row = re.search(r'<tr data-group="%s">(.*?)</tr>' % (group or ""), dom).group(1)
            assert '<td data-field="usd">%.6f</td>' % usd in row
        total = int(re.search(r'<b id="total">(\d+)</b>', dom).group(1))
        assert total == summary["totals"]["requests"] == 15
        # The dead lane trips on its first failure: one failover, as counted.
        shown_fo = int(re.search(r'<b id="failovers">(\d+)</b>', dom).group(1))
        assert shown_fo == summary["totals"]["failovers"] == 1
        assert re.search(r'<b id="p50">[0-9.]+</b>', dom)
        shot = tmp_path / "status-page.png"
        subprocess.run(common + ["--window-size=1200,900", "--screenshot=%s" % shot,
                                 "http://127.0.0.1:%d/" % admin], capture_output=True, timeout=90)
        assert shot.exists() and shot.stat().st_size > 10_000
        if env().get("BUSBAR_DOCS_SCREENSHOT"):     # refreshes docs/status-page.png
            shutil.copy(shot, ROOT / "docs" / "status-page.png")
    finally:
        stop(proc)
