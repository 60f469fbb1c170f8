"""bench/tail.py runs end to end, briefly: busbar traced from inside, every request recorded, the
recorded busbar;dur equal to the Server-Timing header's."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.bench import ROOT


def test_tail_trace_records_every_request(tmp_path):
    out = tmp_path / "tail"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "tail.py"), "--n", "300", "--warm",
                        "50", "--conns", "1,32", "--only", "anthropic-openai", "--top", "5",
                        "--out", str(out)], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "tail.json").read_text())
    assert doc["meta"]["trace"] and doc["meta"]["conns"] == [1, 32]
    assert set(doc["results"]) == {"anthropic-openai-4096/c1", "anthropic-openai-4096/c32"}
    for key, res in doc["results"].items():
        assert res["requests_sent"] == 300, key
        assert res["requests_recorded"] == res["requests_sent"], key
        assert res["overflow"] == 0 and res["pending"] == 0, key
        # the header shows µs: all but a rounding tie or two are the same value
        assert res["matched"] >= res["requests_sent"] - 3, key
        for part in ("dur_us_client", "dur_us_inside"):
            assert set(res[part]) >= {"p50", "p99", "p99.9"}, key
            assert 0 < res[part]["p50"] <= res[part]["p99"] <= res[part]["p99.9"], key
        assert len(res["rows"]) == 300 and len(res["client"]) == 300
        assert len(res["slowest"]) >= 5
        row = res["slowest"][0]
        for field in ("dur_us", "seg1_us", "seg2_us", "offcpu_us", "rdelay_us", "ivcsw", "minflt",
                      "gc", "timers", "lag_us", "infl_start", "infl_end", "others", "connect",
                      "rq_before_us"):
            assert field in row, field
        assert {"gc", "gc0", "gc1", "gc2", "sweep", "other_timer", "stall", "ivcsw", "inflight>1",
                "none"} <= set(res["all_share"]) | {"none"}
        assert "probe" in res and "gc_events" in res and "timer_events" in res
    # concurrency 1: nothing else in flight
    c1 = doc["results"]["anthropic-openai-4096/c1"]
    assert max(r["infl_start"] for r in c1["rows"]) == 0
