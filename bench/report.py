"""The benchmark's tables, rendered from a results file and nothing else.

`render(results, soak=None)` turns what bench/run.py wrote to results.json (and, optionally, what
bench/soak_memory.py wrote) into markdown: the header (commit, machine, date, command), the main
table (wrk at 32 connections, stream TTFB rows), the concurrency-1 table, the scaling table, the
memory soak, the footer, and issue #13's targets with the measured figure beside each. run.py
prints it for a run; bench/readme.py puts it into docs/performance.md from bench/published/, so that
doc's numbers are the published file's, and a test checks that they agree.

Standard library only: the performance-doc test imports it without busbar's venv extras.
"""
from __future__ import annotations

import datetime

FEATURES = "busbar+features"
OBSERVE = "busbar+observe"
HOOK = "busbar+hook"
STORE_PREFIX = "busbar+keys-"     # bench/run.py --stores: busbar+keys-sqlite, -valkey, -postgres


# --------------------------------------------------------------------------------------- formatting

def _f(v, fmt="%.0f"):
    return "—" if v is None else fmt % v


def _mib(kib):
    return "—" if not kib else "%.1f" % (kib / 1024.0)


def _dur(d):
    return "%s / %s / %s" % (_f(d["p50"]), _f(d["p99"]), _f(d["p999"])) if d else "—"


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def _ratio(a, b):
    return ("%.2f×" % (a / b)) if (a and b) else "—"


def gateway_label(results, name):
    if name == "direct":
        return "direct (mock)"
    return results["meta"].get("labels", {}).get(name, name)


def _date(meta):
    try:
        d = datetime.datetime.fromisoformat(meta["date"])
        return d.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except (KeyError, ValueError):
        return meta.get("date", "unknown date")


def header(results):
    m = results["meta"]
    line = "busbar benchmark — commit `%s` — %s (%d cores) — %s — `%s`" % (
        m.get("commit", "unknown"), m.get("cpu", "unknown CPU"), m.get("cores") or 0, _date(m),
        m.get("command", "?"))
    b = m.get("baseline")
    if b:
        line += " — baseline `%s` = `%s` (`--baseline %s`%s)" % (
            b["name"], b["sha"][:12], b["ref"],
            "; its busbar/, cbusbar/ and build files are this commit's: an A/A run, the two rows "
            "differ by noise only" if b.get("same_code") else "")
    return line


# --------------------------------------------------------------------------------------- tables

def main_table(results, failed_notes, marks):
    m = results["meta"]
    rss_idle = m.get("rss_idle_kib", {})
    lines = ["| case | gateway | req/s | busbar;dur p50/p99/p99.9 (µs) | CPU µs/req | ratio to floor "
             "| RSS idle/load/after (MiB) | wrk latency p50/p99 (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for entry in results["cases"]:
        floor_cpu = entry["rows"].get("floor", {}).get("cpu_us_per_req")
        for name, row in entry["rows"].items():
            gw = gateway_label(results, name)
            if "skipped" in row:
                lines.append("| %s | %s | %s | | | | | |" % (entry["label"], gw,
                                                             _cell(row["skipped"])[:160]))
                continue
            if row["non2xx"] or row["socket_errors"]:
                rps = "FAIL: %d non-2xx, %d socket errors" % (row["non2xx"], row["socket_errors"])
                if row["first_bad"]:
                    failed_notes.append("%s / %s: first bad response: %s" % (
                        entry["label"], gw, _cell(row["first_bad"][:200])))
            else:
                rps = "%.0f" % row["rps"]
                if (name != "direct" and row["gateway_core_busy"] < 0.85
                        and row["load_core_busy"] > 0.85):
                    rps += " ‡"
                    marks.add("‡")
            if name == "direct":
                cpu = "mock: %s" % _f(row["mock_cpu_us_per_req"])
                ratio = rss = "—"
            else:
                cpu = _f(row["cpu_us_per_req"])
                ratio = _ratio(row["cpu_us_per_req"], floor_cpu)
                rss = "%s / %s / %s" % (_mib(rss_idle.get(name)), _mib(row.get("rss_load_kib")),
                                        _mib(row.get("rss_after_kib")))
            lat = "%.2f / %.2f" % (row["latency_ms"]["p50"], row["latency_ms"]["p99"])
            if row.get("partial"):
                rps += " (partial: %s)" % _cell(row["partial"])[:80]
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |"
                         % (entry["label"], gw, rps, _dur(row.get("dur_us")), cpu, ratio, rss, lat))
    for entry in results["stream"]:
        floor_cpu = entry["rows"].get("floor", {}).get("cpu_us_per_req")
        for name, row in entry["rows"].items():
            gw = gateway_label(results, name)
            if not row.get("samples"):
                lines.append("| %s | %s | %s | | | | | |" % (
                    entry["label"], gw, "failed: " + _cell(row.get("error", "no samples"))))
                continue
            if name == "direct":
                lines.append("| %s | %s | stream ×%d | — | — | — | — | TTFB p50 %.2f ms |" % (
                    entry["label"], gw, row["samples"], row["ttfb_us"]["p50"] / 1000))
                continue
            c = row.get("cpu_us_per_req")
            status = "stream ×%d" % row["samples"]
            if row.get("non2xx") or row.get("error"):
                status = "FAIL: %d non-2xx%s" % (row.get("non2xx", 0),
                                                 ", " + row["error"] if row.get("error") else "")
                if row.get("first_bad"):
                    failed_notes.append("%s / %s: %s" % (entry["label"], gw,
                                                         _cell(row["first_bad"][:200])))
            added = row.get("added_ttfb_us_median")
            lat = "TTFB p50 %.2f ms, %s µs vs direct" % (
                row["ttfb_us"]["p50"] / 1000, "—" if added is None else "%+.0f" % added)
            lines.append("| %s | %s | %s | %s | %s | %s | — | %s |"
                         % (entry["label"], gw, status, _dur(row.get("dur_us")), _f(c),
                            _ratio(c, floor_cpu), lat))
    return lines


def c1_table(results, failed_notes):
    entries = [e for e in results["cases"] if e.get("c1")]
    if not entries:
        return []
    lines = ["| case | gateway | latency p50 / p99 (µs) | added vs direct: median / p99 (µs) "
             "| added ÷ floor's | busbar;dur p50/p99/p99.9 (µs) |",
             "|---|---|---:|---:|---:|---:|"]
    for entry in entries:
        c1 = entry["c1"]
        if "skipped" in c1:
            lines.append("| %s | — | not measured: %s | | | |" % (entry["label"], _cell(c1["skipped"])))
            continue
        floor_add = (c1["rows"].get("floor", {}).get("added_us") or {}).get("median")
        for name, row in c1["rows"].items():
            gw = gateway_label(results, name)
            if not row.get("samples"):
                lines.append("| %s | %s | failed: %s | | | |" % (
                    entry["label"], gw, _cell(row.get("error", "no samples"))))
                continue
            lat = row["latency_us"]
            text = "%s / %s" % (_f(lat["p50"]), _f(lat["p99"]))
            if row.get("non2xx") or row.get("error"):
                text = "FAIL: %d non-2xx%s; %s" % (row.get("non2xx", 0),
                                                   ", " + row["error"] if row.get("error") else "",
                                                   text)
                if row.get("first_bad"):
                    failed_notes.append("%s / %s at concurrency 1: %s" % (
                        entry["label"], gw, _cell(row["first_bad"][:200])))
            a = row.get("added_us")
            if name == "direct" or not a:
                added = ratio = "—"
            else:
                added = "%+.0f / %s" % (a["median"], "—" if a["p99"] is None else "%+.0f" % a["p99"])
                ratio = ("%.2f×" % (a["median"] / floor_add)) if floor_add and floor_add > 0 else "—"
            lines.append("| %s | %s | %s | %s | %s | %s |"
                         % (entry["label"], gw, text, added, ratio, _dur(row.get("dur_us"))))
    return lines


def scaling_table(results, failed_notes):
    if not results.get("scaling"):
        return []
    lines = ["| case | busbar | req/s | CPU µs/req | cores busy: busbar / load core "
             "| busbar;dur p50/p99/p99.9 (µs) | RSS idle / load (MiB) | PSS idle: all (anon) (MiB) "
             "| wrk latency p50/p99 (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for entry in results["scaling"]:
        for name, row in entry["rows"].items():
            if "skipped" in row:
                lines.append("| %s | %s | %s | | | | | | |" % (entry["label"], name,
                                                                 _cell(row["skipped"])[:160]))
                continue
            if row["non2xx"] or row["socket_errors"]:
                rps = "FAIL: %d non-2xx, %d socket errors" % (row["non2xx"], row["socket_errors"])
                if row["first_bad"]:
                    failed_notes.append("scaling %s / %s: first bad response: %s" % (
                        entry["label"], name, _cell(row["first_bad"][:200])))
            else:
                rps = "%.0f" % row["rps"]
            if row.get("partial"):
                rps += " (partial: %s)" % _cell(row["partial"])[:80]
            lines.append("| %s | %s | %s | %s | %.2f / %.2f | %s | %s / %s | %s | %.2f / %.2f |" % (
                entry["label"], name, rps, _f(row["cpu_us_per_req"]), row["gateway_core_busy"],
                row["load_core_busy"], _dur(row.get("dur_us")), _mib(row.get("rss_idle_kib")),
                _mib(row.get("rss_load_kib")), _pss(row),
                row["latency_ms"]["p50"], row["latency_ms"]["p99"]))
    return lines


def _pss(row):
    if row.get("pss_anon_idle_kib"):
        return "%s (%s)" % (_mib(row.get("pss_idle_kib")), _mib(row["pss_anon_idle_kib"]))
    return _mib(row.get("pss_idle_kib"))


def soak_section(soak):
    if not soak:
        return []
    m = soak["meta"]
    r = soak["result"]
    lines = ["**Hostile memory soak** — commit `%s` — %s (%d cores) — %s — `%s`" % (
        m.get("commit", "unknown"), m.get("cpu", "unknown CPU"), m.get("cores") or 0, _date(m),
        m.get("command", "?")), ""]
    lines.append("| figure | measured |")
    lines.append("|---|---:|")
    L = soak["load"]
    lines.append("| load | %s → %s lane, ~%d KB unique bodies, %d connections, %d s; %d requests "
                 "(%d 2xx, %d non-2xx, %d failed), %.0f req/s |" % (
                     L["ingress"], L["egress"], round(L["body_bytes"] / 1000), L["connections"],
                     L["seconds"], L["requests"], L["ok"], L["non2xx"], L["failed"], L["rps"]))
    lines.append("| busbar | `serve` with its default workers: %d process(es)%s |" % (
        r["processes"], "; environment: %s" % ", ".join("`%s`" % e for e in m["busbar_env"])
        if m.get("busbar_env") else ""))
    lines.append("| PSS idle (before load) | %s MiB |" % _mib(r["pss_idle_kib"]))
    lines.append("| PSS peak / RSS peak (during load) | %s / %s MiB |" % (
        _mib(r["pss_peak_kib"]), _mib(r["rss_peak_kib"])))
    after = ", ".join("%d s: %s" % (int(k), _mib(v)) for k, v in sorted(
        r["pss_after_kib"].items(), key=lambda kv: float(kv[0])))
    lines.append("| PSS after the load ended (MiB) | %s |" % after)
    lines.append("| RSS after the load ended (MiB) | %s |" % ", ".join(
        "%d s: %s" % (int(k), _mib(v)) for k, v in sorted(r["rss_after_kib"].items(),
                                                          key=lambda kv: float(kv[0]))))
    lines.append("| verdict | %s |" % _cell(r["verdict"]))
    d = r.get("diagnose")
    if d:
        for pid, p in sorted(d["processes"].items()):
            for tag, label in (("peak_in_use", "at the peak of heap bytes in use"),
                               ("end", "30+ s after the load"),
                               ("after_malloc_trim", "then after malloc_trim(0)")):
                x = p.get(tag)
                if x:
                    pm = x.get("pymalloc") or {}
                    pym = ""
                    if pm.get("arenas allocated current") and pm.get("bytes in allocated blocks"):
                        pym = "; pymalloc: %s arenas of 1 MiB, %s MiB in allocated blocks" % (
                            pm["arenas allocated current"],
                            _mib(int(pm["bytes in allocated blocks"]) / 1024))
                    lines.append("| `--diagnose` pid %s, %s | glibc heap in use %s, free but kept "
                                 "%s, mmapped %s MiB; [heap] RSS %s MiB, anonymous RSS %s MiB; %d "
                                 "gc objects%s |" % (
                                     pid, label, _mib(x["heap_in_use_kib"]),
                                     _mib(x["heap_free_kept_kib"]), _mib(x["mmapped_kib"]),
                                     _mib(x["heap_rss_kib"]), _mib(x["anon_rss_kib"]),
                                     x["gc_objects"], pym))
        lines.append("| `--diagnose`: the tree after every process called malloc_trim(0) "
                     "| PSS %s / RSS %s MiB |" % (_mib(d["pss_after_malloc_trim_kib"]),
                                                  _mib(d["rss_after_malloc_trim_kib"])))
    return lines


def _store_rows(meta):
    """The --stores rows of a run (busbar with keys on one store each), in their order."""
    return [n for n in meta.get("labels", {}) if n.startswith(STORE_PREFIX)]


def footer(results):
    m = results["meta"]
    g, l = m.get("gateway_core", 0), m.get("load_core", 1)
    stream_n = results["stream"][0]["n"] if results["stream"] else "N"
    text = (
        "Pinning (%d cores): the gateway under test (busbar `--workers 1`%s, the floor, LiteLLM "
        "`--num_workers 1`) on core %d (`taskset -c %d`); the mock, wrk (1 thread, %d keep-alive "
        "connections, a unique body per request), run.py and its stream-TTFB and concurrency-1 "
        "client share core %d (`taskset -c %d`). "
        "Runs interleaved per case: busbar%s, floor[, LiteLLM], direct, then the gateways again, %d "
        "s each; ratio = CPU µs/req ÷ the floor's in the same case. busbar;dur = Server-Timing "
        "(busbar's own time, upstream wait excluded; p99 from ≥100 samples, p99.9 from ≥1000). "
        "CPU µs/req = utime+stime of the gateway's process tree ÷ requests (direct row: the mock's; "
        "stream rows: schedstat on-CPU ns). RSS: idle before any load / peak during the case / ~5 s "
        "after its last run. wrk latency: mean of the runs' p50/p99. Stream rows: %s streamed "
        "requests per gateway, interleaved with direct (the gateways in balanced orders behind it); "
        "TTFB = request written → first body byte's arrival (kernel receive timestamp); "
        "\"vs direct\" = median of the paired differences."
        % (m.get("cores") or 0,
           ", the baseline `%s`" % m["baseline"]["name"] if m.get("baseline") else "",
           g, g, m.get("connections", 32), l, l,
           "[, %s]" % ", ".join(x for x in ([m["baseline"]["name"]] if m.get("baseline") else [])
                                + [x for x in (OBSERVE, FEATURES, HOOK)
                                   if m.get("labels", {}).get(x)] + _store_rows(m))
           if (m.get("baseline") or m.get("labels", {}).get(FEATURES) or _store_rows(m)) else "",
           m.get("duration_s", 0), stream_n))
    return text


def c1_footer(results):
    ns = [e["c1"]["n"] for e in results["cases"] if e.get("c1") and "n" in e["c1"]]
    if not ns:
        return ""
    return (
        "Concurrency 1: %d requests per gateway (after 20 unmeasured), one at a time, interleaved "
        "request by request (direct first, then the gateways in balanced orders: each in every place "
        "and right after every other gateway equally often), each "
        "gateway on its own keep-alive connection; after each request the client waits until that "
        "gateway and the mock are idle. "
        "Latency = request written → arrival of the response (kernel receive timestamp of the "
        "segment holding the first body byte; these answers are one segment). Added = gateway minus "
        "the direct request of the same round, paired; \"added ÷ floor's\" = busbar's median added "
        "latency ÷ the floor's. The client shares core %d with the mock, the gateway has core %d: "
        "a gateway row crosses cores twice, so the floor row is what the extra hop itself costs. "
        "LiteLLM is not run at concurrency 1."
        % (max(ns), results["meta"].get("load_core", 1), results["meta"].get("gateway_core", 0)))


def scaling_footer(results):
    if not results.get("scaling"):
        return ""
    m = results["meta"]
    return (
        "Scaling: busbar started with `serve --workers 1` and with `serve --workers 2` (its default "
        "on this machine), each allowed on cores %s (no pin), the same config as the busbar row; "
        "the mock and wrk (1 thread, %d connections, unique bodies) stay pinned to core %d, so with "
        "2 workers one worker shares core %d with the load generator and the mock: req/s here is "
        "what these %d cores give the whole system, not what a second core gives busbar. CPU µs/req "
        "(utime+stime summed over busbar's process tree ÷ requests) is the figure that transfers to "
        "bigger machines. Interleaved w1, w2, w1, w2, %d s each. \"cores busy\": busbar's CPU ÷ wall "
        "time (up to 2.00 with 2 workers) and the load core's (mock + wrk). PSS idle: Pss from "
        "/proc/<pid>/smaps_rollup summed over the process tree before any load (shared pages "
        "divided among the processes that map them; RSS counts them once per process). File pages "
        "(the python binary, shared libraries, extensions) are shared with every other process "
        "mapping them on the machine, so the total falls as more Python processes run; the anon "
        "part (in parentheses: the heap, Python's objects, copy-on-write pages of the workers) does "
        "not depend on them."
        % (m.get("all_cores", "0,1"), m.get("connections", 32), m.get("load_core", 1),
           m.get("load_core", 1), m.get("cores") or 0, m.get("duration_s", 0)))


# --------------------------------------------------------------------------------------- targets

def _case(results, key):
    return next((e for e in results["cases"] if e["key"] == key), None)


def _row(results, key, name):
    e = _case(results, key)
    if e is None:
        return None
    r = e["rows"].get(name)
    return None if (r is None or "skipped" in r) else r


def _cpu_ratio(results, key, name="busbar"):
    r, f = _row(results, key, name), _row(results, key, "floor")
    if r and f and r.get("cpu_us_per_req") and f.get("cpu_us_per_req"):
        return r["cpu_us_per_req"] / f["cpu_us_per_req"]
    return None


def _verdict(ok):
    return "—" if ok is None else ("met" if ok else "**missed**")


def _tail_rows(results):
    """(at c32: [(label, p50, p999)], at c1: [...]) for the busbar rows with a p99.9."""
    c32, c1 = [], []
    for e in results["cases"]:
        d = (e["rows"].get("busbar") or {}).get("dur_us")
        if d and d.get("p999") is not None:
            c32.append((e["label"], d["p50"], d["p999"]))
        r = ((e.get("c1") or {}).get("rows") or {}).get("busbar") or {}
        d = r.get("dur_us")
        if d and d.get("p999") is not None:
            c1.append((e["label"], d["p50"], d["p999"]))
    return c32, c1


def targets(results, soak=None):
    """Issue #13's targets, each with the figure measured in `results` (and `soak`): a list of
    (target, measured, verdict)."""
    out = []
    k8 = "anthropic-anthropic-100"
    r = _row(results, k8, "busbar")
    out.append(("Anthropic → Anthropic, ~8 tok: keep (13 / 43 / 94 µs, 1.05× the floor's CPU when "
                "#13 was filed)",
                "%s µs, %s the floor's CPU" % (_dur(r.get("dur_us")), _ratio(
                    r.get("cpu_us_per_req"), (_row(results, k8, "floor") or {}).get("cpu_us_per_req")))
                if r else "not measured", "—"))
    r = _row(results, "anthropic-anthropic-32768", "busbar")
    d = (r or {}).get("dur_us") or {}
    ok = None
    if d.get("p999") is not None and d.get("p50"):
        ok = d["p999"] <= 3 * d["p50"]
    out.append(("Anthropic → Anthropic, ~12k tok: busbar;dur p99.9 ≤ 3× p50 (32 connections)",
                "p50 %s, p99.9 %s µs (%s)" % (_f(d.get("p50")), _f(d.get("p999")),
                                            "%.1f×" % (d["p999"] / d["p50"]) if ok is not None else "—")
                if d else "not measured", _verdict(ok)))
    x = _cpu_ratio(results, "anthropic-openai-100")
    out.append(("Anthropic → OpenAI, ~8 tok: CPU ≤ 1.3× the floor's",
                "%.2f×" % x if x else "not measured", _verdict(None if x is None else x <= 1.3)))
    d = ((_row(results, "anthropic-openai-4096", "busbar") or {}).get("dur_us")) or {}
    out.append(("Anthropic → OpenAI, ~1k tok: busbar;dur p50 ≤ 40 µs",
                "%s µs" % _f(d.get("p50")) if d else "not measured",
                _verdict(None if not d else d["p50"] <= 40)))
    d = ((_row(results, "anthropic-openai-32768", "busbar") or {}).get("dur_us")) or {}
    x = _cpu_ratio(results, "anthropic-openai-32768")
    ok = None if (not d or x is None) else (d["p50"] <= 90 and x <= 1.6)
    out.append(("Anthropic → OpenAI, ~12k tok: busbar;dur p50 ≤ 90 µs and CPU ≤ 1.6× the floor's",
                "p50 %s µs, %s" % (_f(d.get("p50")), "%.2f×" % x if x else "—")
                if d or x else "not measured", _verdict(ok)))
    st = next((e for e in results["stream"] if e["ingress"] == "anthropic"
               and e["egress"] == "openai"), None)
    if st:
        b, f = st["rows"].get("busbar", {}), st["rows"].get("floor", {})
        x = (b["cpu_us_per_req"] / f["cpu_us_per_req"]) if b.get("cpu_us_per_req") and \
            f.get("cpu_us_per_req") else None
        ba, fa = b.get("added_ttfb_us_median"), f.get("added_ttfb_us_median")
        ok = None if (x is None or ba is None or fa is None) else (x <= 1.2 and ba <= fa + 100)
        measured = "CPU %s; TTFB %s µs vs direct (floor %s): floor + %s µs" % (
            "%.2f×" % x if x else "—", _f(ba, "%+.0f"), _f(fa, "%+.0f"),
            _f(None if ba is None or fa is None else ba - fa))
    else:
        ok, measured = None, "not measured"
    out.append(("streamed Anthropic → OpenAI, ~1k tok: CPU ≤ 1.2× the floor's, TTFB ≤ floor + "
                "100 µs", measured, _verdict(ok)))
    c32, c1 = _tail_rows(results)
    parts, oks = [], []
    for name, rows in (("32 connections", c32), ("concurrency 1", c1)):
        if not rows:
            parts.append("%s: no row with ≥ 1000 samples" % name)
            continue
        bad = [(lbl, p999 / p50) for lbl, p50, p999 in rows if p50 and p999 > 3 * p50]
        worst = max(rows, key=lambda t: t[2] / t[1] if t[1] else 0)
        oks.append(not bad)
        parts.append("%s: %d of %d rows (worst: %s, %s / %s µs = %.1f×)" % (
            name, len(rows) - len(bad), len(rows), worst[0], _f(worst[1]), _f(worst[2]),
            worst[2] / worst[1] if worst[1] else float("nan")))
    out.append(("busbar;dur p99.9 ≤ 3× p50 on every row at concurrency 1 and 32", "; ".join(parts),
                _verdict(None if not oks else all(oks) and len(oks) == 2)))
    ratios = []
    for e in results["cases"]:
        rows = (e.get("c1") or {}).get("rows") or {}
        b = (rows.get("busbar") or {}).get("added_us")
        f = (rows.get("floor") or {}).get("added_us")
        if b and f and f["median"] > 0:
            ratios.append((e["label"], b["median"], f["median"], b["median"] / f["median"]))
    if ratios:
        met = [x for x in ratios if x[3] <= 1.1]
        worst = max(ratios, key=lambda x: x[3])
        best = min(ratios, key=lambda x: x[3])
        measured = ("%d of %d cases; from %.2f× (%s: %+.0f vs %+.0f µs) to %.2f× (%s: %+.0f vs "
                    "%+.0f µs)" % (len(met), len(ratios), best[3], best[0], best[1], best[2],
                                   worst[3], worst[0], worst[1], worst[2]))
        ok = len(met) == len(ratios)
    else:
        measured, ok = "not measured", None
    out.append(("added latency at concurrency 1 (median, paired with direct): busbar ≤ 1.1× the "
                "floor's", measured, _verdict(ok)))
    idle = {}
    for e in results.get("scaling", []):
        for row in e["rows"].values():
            if row.get("pss_idle_kib"):
                idle[row["workers"]] = row["pss_idle_kib"]
    if 1 in idle:
        measured = "1 worker: %s MiB" % _mib(idle[1])
        ok = idle[1] <= 20 * 1024
        if 2 in idle:
            measured += "; 2 workers: %s MiB (+%s MiB for the second)" % (
                _mib(idle[2]), _mib(idle[2] - idle[1]))
            ok = ok and (idle[2] - idle[1]) <= 8 * 1024
    else:
        measured, ok = "not measured", None
    out.append(("idle PSS of the process tree: ≤ 20 MiB with one worker, ≤ 8 MiB for each further "
                "worker", measured, _verdict(ok)))
    if soak:
        s = soak["result"]
        measured = ("RSS peak %s MiB; PSS idle %s, peak %s, 30 s after the load %s MiB (%s)"
                    % (_mib(s["rss_peak_kib"]), _mib(s["pss_idle_kib"]), _mib(s["pss_peak_kib"]),
                       _mib(s["pss_after_kib"].get("30")),
                       "back within 20 %% after %s s" % _f(s["back_within_s"], "%.1f")
                       if s.get("back_within_s") is not None else "not back within 20 % in 30 s"))
        ok = s["passed"]
    else:
        measured, ok = "not in this results file (bench/soak_memory.py)", None
    out.append(("hostile soak (unique 150 KB bodies, concurrency 1000, 60 s, cross-protocol): RSS "
                "≤ 400 MiB, back within 20 % of idle within 30 s", measured, _verdict(ok)))
    plain = _cpu_ratio(results, k8)
    obs = _cpu_ratio(results, k8, OBSERVE)
    if obs is not None:
        out.append(("issue #11: metrics and the access log on, small same-protocol: CPU ≤ 1.2× the "
                    "floor's; rows with them on and off",
                    "%.2f× (plain busbar in the same case: %s)" % (obs, "%.2f×" % plain if plain
                                                                    else "—"),
                    _verdict(obs <= 1.2)))
    x = _cpu_ratio(results, k8, FEATURES)
    out.append(("features on (keys on SQLite, metrics, access log), small same-protocol: CPU ≤ 1.3× "
                "the floor's; both rows reported",
                "%.2f× (plain busbar in the same case: %s)" % (x, "%.2f×" % plain if plain else "—")
                if x else "not measured", _verdict(None if x is None else x <= 1.3)))
    for name in _store_rows(results["meta"]):
        x = _cpu_ratio(results, k8, name)
        d = (_row(results, k8, name) or {}).get("dur_us") or {}
        out.append(("issue #41: %s, small same-protocol: CPU ≤ 1.5× the floor's" % gateway_label(
            results, name),
                    "%.2f×, busbar;dur p50 %s µs (keys off in the same case: %s)" % (
                        x, _f(d.get("p50")), "%.2f×" % plain if plain else "—")
                    if x else "not measured", _verdict(None if x is None else x <= 1.5)))
    sc = []
    for e in results.get("scaling", []):
        rows = e["rows"]
        cells = []
        for row in rows.values():
            if "skipped" in row:
                continue
            ok100 = not (row["non2xx"] or row["socket_errors"])
            cells.append("%d worker%s %s req/s%s, %s µs CPU/req" % (
                row["workers"], "s" if row["workers"] > 1 else "", _f(row["rps"]),
                "" if ok100 else " (FAILED requests)", _f(row["cpu_us_per_req"])))
        if cells:
            sc.append("%s: %s" % (e["label"], "; ".join(cells)))
    out.append(("scaling: req/s with --workers 1 and 2 at 100 % success, unique bodies, CPU µs per "
                "request", " — ".join(sc) if sc else "not measured", "—"))
    return out


def targets_table(results, soak=None):
    lines = ["| #13 target | measured | |", "|---|---|---|"]
    for t, m, v in targets(results, soak):
        lines.append("| %s | %s | %s |" % (_cell(t), _cell(m), v))
    return lines


# --------------------------------------------------------------------------------------- all

def render(results, soak=None, with_targets=True):
    """The whole report as markdown (ends with a newline)."""
    failed_notes, marks = [], set()
    lines = [header(results), ""]
    lines += main_table(results, failed_notes, marks)
    lines += ["", footer(results)]
    if "‡" in marks:
        lines += ["", "‡ core %d (mock + wrk) was ≥ 85 %% busy while the gateway's core was not: the "
                  "gateway had headroom, so this req/s is the load side's limit; compare CPU µs/req."
                  % results["meta"].get("load_core", 1)]
    c1 = c1_table(results, failed_notes)
    if c1:
        lines += ["", "**Concurrency 1** (same run):", ""] + c1 + ["", c1_footer(results)]
    sc = scaling_table(results, failed_notes)
    if sc:
        lines += ["", "**Scaling** (same run):", ""] + sc + ["", scaling_footer(results)]
    if soak:
        lines += [""] + soak_section(soak)
    if with_targets:
        lines += ["", "**Issue #13's targets** (and #11's cost target), each beside the figure "
                  "measured above%s:" % (
            " and in the soak" if soak else ""), ""] + targets_table(results, soak)
    for note in failed_notes + results.get("notes", []):
        lines += ["", "Note: " + note]
    return "\n".join(lines) + "\n"
