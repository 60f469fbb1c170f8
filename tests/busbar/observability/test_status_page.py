"""The live status page in a real browser: headless Chromium (Debian's `chromium`, installed by
`make chromium`, which `make test` runs) loads `GET /` from the admin routes, the page fetches
/stats and /status.json, and the numbers it renders are checked against those endpoints. A
screenshot is saved (docs/status-page.png is one)."""
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


def _get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _post(port, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            {"content-type": "application/json"})
        return c.getresponse().status
    finally:
        c.close()


def test_status_page_in_chromium(mock_port, tmp_path):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium is not installed and could not be: `make chromium` installs Debian's "
                    "chromium with apt-get (needs root or passwordless sudo)")
    port, admin = free_port(), free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(port=port, mock=mock_port, dead=free_port()) +
                   "observability: {access_log: off, metrics: true}\n"
                   'admin_listen: "127.0.0.1:%d"\nauth: {admin_open: true}\n' % admin)
    proc = subprocess.Popen([PY, "-m", "busbar.cli", "serve", "--config", str(cfg), "--workers", "1"],
                            cwd=ROOT, env=env())
    try:
        wait_http(port, proc)
        wait_http(admin, proc, "/stats")
        for _ in range(12):
            assert _post(port, "mixed") == 200
        for _ in range(3):
            assert _post(port, "failover") == 200
        assert _get(admin, "/")[0] == 200
        profile = tmp_path / "profile"
        common = [chromium, *FLAGS, "--user-data-dir=%s" % profile, "--virtual-time-budget=6000"]
        dom = subprocess.run(common + ["--dump-dom", "http://127.0.0.1:%d/" % admin],
                             capture_output=True, text=True, timeout=90).stdout
        assert 'data-renders="' in dom, dom[-2000:]
        stats = json.loads(_get(admin, "/stats")[1])
        summary = json.loads(_get(admin, "/status.json")[1])
        # The lanes and pools shown are /stats' own.
        shown = re.findall(r'<tr data-lane="([^"]+)">', dom)
        assert shown == [l["model"] for l in stats["lanes"]]
        assert re.findall(r'<tr data-pool="([^"]+)">', dom) == list(stats["pools"])
        for lane in stats["lanes"]:
            row = re.search(r'<tr data-lane="%s">(.*?)</tr>' % re.escape(lane["model"]), dom).group(1)
            assert '<td data-field="inflight">%d</td>' % lane["inflight"] in row
            assert 'data-field="breaker_state">%s</td>' % lane["breaker_state"] in row
            limit = "–" if lane["limit"] is None else str(lane["limit"])
            assert '<td data-field="limit">%s</td>' % limit in row
        total = int(re.search(r'<b id="total">(\d+)</b>', dom).group(1))
        assert total == summary["totals"]["requests"] == 15
        # The dead lane fails over until its breaker opens: 1 to 3 failovers, as counted.
        shown_fo = int(re.search(r'<b id="failovers">(\d+)</b>', dom).group(1))
        assert shown_fo == summary["totals"]["failovers"] and 1 <= shown_fo <= 3
        assert re.search(r'<b id="p50">[0-9.]+</b>', dom)
        shot = tmp_path / "status-page.png"
        subprocess.run(common + ["--window-size=1200,900", "--screenshot=%s" % shot,
                                 "http://127.0.0.1:%d/" % admin], capture_output=True, timeout=90)
        assert shot.exists() and shot.stat().st_size > 10_000
        if env().get("BUSBAR_DOCS_SCREENSHOT"):     # refreshes docs/status-page.png
            shutil.copy(shot, ROOT / "docs" / "status-page.png")
    finally:
        stop(proc)
