"""bench/report.py renders every row from a results dict alone (baseline, features, concurrency 1,
scaling, soak, #13 targets); the helpers that make those figures compute what they say."""
from __future__ import annotations

import os
import pathlib

import pytest

from tests.bench import ROOT, bench_module as _module


report = _module("report")
run = _module("run")
soak = _module("soak_memory")
baseline = _module("baseline")
procs = _module("procs")


def _row(cpu, dur=None, rps=1000.0):
    return {"runs": 2, "requests": 10000, "rps": rps, "non2xx": 0, "socket_errors": 0,
            "first_bad": "", "cpu_us_per_req": cpu, "dur_us": dur,
            "latency_ms": {"p50": 1.0, "p99": 2.0}, "gateway_core_busy": 0.9,
            "load_core_busy": 0.5, "mock_cpu_us_per_req": 20.0, "rss_load_kib": 40000,
            "rss_after_kib": 39000}


def _c1(added, dur=None, n=1000):
    r = {"samples": n, "kernel_stamped": n, "latency_us": {"p50": 100 + added, "p99": 200 + added}}
    if added:
        r["added_us"] = {"pairs": n, "median": added, "p99": added * 2}
    if dur:
        r["dur_us"] = dur
    return r


def _results(with_baseline=True):
    dur = {"samples": 5000, "p50": 20.0, "p99": 50.0, "p999": 55.0}
    names = ["busbar"] + (["busbar@abc1234"] if with_baseline else []) + [
        "busbar+observe", "busbar+features", "floor", "direct"]
    rows = {"busbar": _row(36.0, dur), "busbar+observe": _row(35.0, dur),
            "busbar+features": _row(50.0, dur), "floor": _row(30.0), "direct": _row(20.0)}
    if with_baseline:
        rows["busbar@abc1234"] = _row(45.0, dur)
    rows = {n: rows[n] for n in names}
    c1 = {"n": 1000, "warmup": 20, "rows": {"busbar": _c1(60, {"samples": 1000, "p50": 30.0,
                                                                "p99": 60.0, "p999": 200.0}),
                                            "floor": _c1(50), "direct": _c1(0)}}
    case = {"key": "anthropic-anthropic-100", "label": "Anthropic → Anthropic, ~8 tok / ~100 B",
            "ingress": "anthropic", "egress": "anthropic", "rows": rows, "c1": c1}
    x = {"key": "anthropic-openai-4096", "label": "Anthropic → OpenAI Chat, ~1k tok / ~4 KB",
         "ingress": "anthropic", "egress": "openai",
         "rows": {"busbar": _row(60.0, {"samples": 5000, "p50": 35.0, "p99": 80.0, "p999": 140.0}),
                  "floor": _row(40.0), "direct": _row(25.0)}}
    stream = {"label": "stream TTFB: Anthropic → OpenAI Chat", "ingress": "anthropic",
              "egress": "openai", "n": 200,
              "rows": {"busbar": {"samples": 200, "ttfb_us": {"p50": 500.0, "p99": 900.0},
                                  "added_ttfb_us_median": 250.0, "cpu_us_per_req": 600.0},
                       "floor": {"samples": 200, "ttfb_us": {"p50": 400.0, "p99": 800.0},
                                 "added_ttfb_us_median": 180.0, "cpu_us_per_req": 550.0},
                       "direct": {"samples": 200, "ttfb_us": {"p50": 200.0, "p99": 300.0}}}}
    sc = {"key": "anthropic-anthropic-100", "label": case["label"], "cores": "0,1", "rows": {}}
    for w, pss in ((1, 19 * 1024), (2, 29 * 1024)):
        r = _row(33.0 + w, dur, rps=15000.0 + w)
        r.update(workers=w, processes=w, rss_idle_kib=30000 * w, pss_idle_kib=pss)
        sc["rows"]["busbar --workers %d" % w] = r
    meta = {"commit": "deadbee", "cpu": "Test CPU", "cores": 2, "command": "bench/run.py --quick",
            "date": "2026-12-03T15:00:00+00:00", "duration_s": 1, "connections": 32,
            "gateway_core": 0, "load_core": 1, "all_cores": "0,1",
            "rss_idle_kib": {n: 30000 for n in names},
            "labels": {"busbar+features": "busbar, keys (SQLite) + metrics + access log",
                       "busbar+observe": "busbar, metrics + access log"},
            "baseline": ({"ref": "main~3", "sha": "abc1234" + "0" * 33, "short": "abc1234",
                          "name": "busbar@abc1234"} if with_baseline else None)}
    return {"meta": meta, "cases": [case, x], "stream": [stream], "scaling": [sc], "notes": []}


def _line(text, *cells):
    hits = [ln for ln in text.splitlines() if all(c in ln for c in cells)]
    assert hits, "no line with %r" % (cells,)
    return hits[0]


def test_baseline_row_has_its_own_ratio_to_the_floor():
    text = report.render(_results())
    assert "baseline `busbar@abc1234`" in text.splitlines()[0]
    assert "| 1.50× |" in _line(text, "| busbar@abc1234 |")       # 45 / 30
    assert "| 1.20× |" in _line(text, "~100 B | busbar |")         # 36 / 30


def test_without_baseline_there_is_no_baseline_row():
    text = report.render(_results(with_baseline=False))
    assert "busbar@" not in text


def test_features_row_is_labelled_and_in_the_targets():
    text = report.render(_results())
    assert "| 1.67× |" in _line(text, "| busbar, keys (SQLite) + metrics + access log |")
    t = _line(text, "features on (keys on SQLite")
    assert "1.67×" in t and "plain busbar in the same case: 1.20×" in t and "**missed**" in t


def test_concurrency_1_rows():
    text = report.render(_results())
    line = _line(text, "**Concurrency 1**")
    assert line
    row = _line(text, "~100 B | busbar | 160 / 260 |")
    assert "+60 / +120" in row and "1.20×" in row and "30 / 60 / 200" in row
    t = _line(text, "added latency at concurrency 1")
    assert "0 of 1 cases" in t and "**missed**" in t
    t = _line(text, "p99.9 ≤ 3× p50 on every row")
    assert "32 connections: 1 of 2 rows" in t and "concurrency 1: 0 of 1 rows" in t


def test_scaling_rows_and_memory_target():
    text = report.render(_results())
    assert "15001" in _line(text, "| busbar --workers 1 |")
    assert "29.0" in _line(text, "| busbar --workers 2 |")
    t = _line(text, "idle PSS of the process tree")
    assert "1 worker: 19.0 MiB" in t and "+10.0 MiB for the second" in t and "**missed**" in t


def test_targets_met_and_missed():
    text = report.render(_results())
    assert "met" in _line(text, "~1k tok: busbar;dur p50 ≤ 40 µs")           # 35
    t = _line(text, "streamed Anthropic → OpenAI")
    assert "floor + 70 µs" in t and "| met |" in t                           # 600/550 = 1.09
    assert "not measured" in _line(text, "~12k tok: busbar;dur p50 ≤ 90 µs")


def test_soak_section_and_target():
    res = _results()
    samples = [(t * 0.5, 20000, 30000, 3) for t in range(10)]                    # idle
    samples += [(5 + t * 0.5, 200000, 300000, 3) for t in range(20)]             # load 5..15 s
    samples += [(15.5 + t * 0.5, 22000, 33000, 3) for t in range(70)]            # after
    r = soak.evaluate(samples, 4.5, 5.0, 15.0, 400 * 1024)
    assert r["passed"] and r["pss_idle_kib"] == 20000 and r["rss_peak_kib"] == 300000
    assert r["back_within_s"] == 0.5 and r["pss_after_kib"]["30"] == 22000
    doc = {"meta": {"commit": "deadbee", "cpu": "Test CPU", "cores": 2, "command": "soak",
                    "date": "2026-12-03T15:00:00+00:00"},
           "load": {"ingress": "Anthropic", "egress": "OpenAI Chat", "body_bytes": 150000,
                    "connections": 1000, "seconds": 60, "requests": 10, "ok": 10, "non2xx": 0,
                    "failed": 0, "rps": 1.0},
           "result": dict(r, processes=3)}
    text = report.render(res, doc)
    assert "**Hostile memory soak**" in text
    assert "| met |" in _line(text, "hostile soak (unique 150 KB bodies")


def test_soak_fails_on_peak_and_on_memory_not_coming_back():
    idle = [(t * 0.5, 20000, 30000, 3) for t in range(10)]
    load = [(5 + t * 0.5, 200000, 500 * 1024, 3) for t in range(20)]
    after = [(15.5 + t * 0.5, 40000, 50000, 3) for t in range(70)]
    r = soak.evaluate(idle + load + after, 4.5, 5.0, 15.0, 400 * 1024)
    assert not r["passed"]
    assert "peak RSS" in r["verdict"] and "30 s after the load" in r["verdict"]
    assert r["back_within_s"] is None


def test_c1_row_pairs_each_request_with_the_direct_one_of_its_round():
    # (ttfb_ns, total_ns, status, server_timing, head, kernel-stamped)
    direct = [(100_000 + i * 1000, 0, 200, None, b"", True) for i in range(100)]
    gw = [(150_000 + i * 1000, 0, 200, b"busbar;dur=0.020", b"", True) for i in range(100)]
    row = run.c1_row(gw, direct, None)
    assert row["added_us"]["median"] == pytest.approx(50.0)
    assert row["added_us"]["p99"] == pytest.approx(50.0)
    assert row["dur_us"]["p50"] == pytest.approx(20.0)
    assert row["dur_us"]["p999"] is None               # fewer than 1000 samples
    bad = run.c1_row([(1, 0, 503, None, b"busy", False)], None, "request 2 failed")
    assert bad["non2xx"] == 1 and bad["error"] == "request 2 failed"


def test_baseline_resolve_and_loaded_from():
    with pytest.raises(baseline.BaselineError):
        baseline.resolve("no-such-ref-" + "x" * 12)
    sha = baseline.resolve("HEAD")
    assert len(sha) == 40
    import cbusbar.h1  # noqa: F401  (maps one of this tree's extensions into this process)
    tree = pathlib.Path(cbusbar.h1.__file__).resolve().parent.parent
    assert baseline.loaded_from([os.getpid()], tree)
    assert not baseline.loaded_from([os.getpid()], ROOT / "bench" / ".baseline" / ("0" * 40))


def test_pss_of_this_process():
    r = procs.smaps_rollup(os.getpid())
    assert r["Pss"] > 0 and r["Rss"] >= r["Pss"]
    assert procs.smaps_rollup(2 ** 22 + 12345) == {}


def test_baseline_same_code():
    assert baseline.same_code(baseline.resolve("HEAD")) in (True, False)
    res = _results()
    res["meta"]["baseline"]["same_code"] = True
    assert "an A/A run" in report.render(res).splitlines()[0]
    res["meta"]["baseline"]["same_code"] = False
    assert "an A/A run" not in report.render(res).splitlines()[0]
    if baseline._git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
        pytest.skip("a shallow clone has no first commit to compare with")
    first = baseline._git("rev-list", "--max-parents=0", "HEAD").stdout.decode().split()[0]
    assert baseline.same_code(first) is False


def test_observe_row_is_labelled_and_in_the_targets():
    """Issue #11: the access log and metrics cost, a row with them on beside the plain one."""
    text = report.render(_results())
    assert "| 1.17× |" in _line(text, "| busbar, metrics + access log |")      # 35 / 30
    t = _line(text, "issue #11: metrics and the access log on")
    assert "1.17×" in t and "plain busbar in the same case: 1.20×" in t and "| met |" in t
    assert "busbar+observe, busbar+features" in text        # in the interleaving order footer
