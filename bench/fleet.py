"""Two busbar instances on one Valkey against one instance (issue #41's "scale across machines"):
req/s of the fleet and of one instance, same mock, same load, interleaved, and a check that a
limit the two instances share stays exact.

Everything is bench/run.py's (its Bench: processes, pinning, the store's loopback redis-server,
the key minted through the admin API, wrk with bench/load.lua's unique bodies); this script only
arranges the instances:

- `one`: one busbar (`serve --workers 1`) on the gateway core, wrk with --connections (32);
- `two`: two busbars on the same Valkey database (the same store, signing key and group), one on
  each core (on this 2-core VM the second shares the load core with the mock, wrk and Valkey:
  what two instances get here is what the machine gives, not what a second machine would), two
  wrk processes at once with half the connections each; req/s is their sum;
- the same two arrangements with keys off (`--control`, default on): the machine's own ceiling
  for two instances without a shared store, so the Valkey rows can be read against it;
- `exact`: a group with a limit of --limit requests per minute, a key of it, both instances
  loaded at once for 3 s (inside one minute window): the 2xx answers of the two together must be
  exactly --limit (the rest 429).

    .venv/bin/python bench/fleet.py [--duration 3] [--rounds 2] [--limit 2000] [--no-control]

Small Anthropic → Anthropic calls (~8 tokens), as the fleet rows of bench/run.py. Prints a
markdown table (commit, machine, command in the header) and writes fleet.json beside the logs in
bench/results/fleet-<UTC timestamp>/.
"""
from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import pathlib
import shlex
import sys
import threading
import time

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import payloads  # noqa: E402
import procs  # noqa: E402
import run  # noqa: E402

CASE = run.Case("anthropic", "anthropic", run.SIZES[0], False)


class FleetBench(run.Bench):
    """bench/run.py's Bench, with one more group (`exact`, a requests-per-minute limit) and the
    store shared: every busbar started with keys on valkey gets the same Redis database."""

    limit = 2000

    def keys_config(self, keys, tag):
        text = super().keys_config(keys, tag)
        return text.replace("groups:\n", "groups:\n  exact: {limits: [{requests: %d, per: minute}]}\n"
                            % self.limit, 1)

    def store_yaml(self, keys, tag):
        self.redis_db = 0           # every instance on database 0: one store for the fleet
        return super().store_yaml(keys, tag)


def mint(port, token, group):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/api/v1/admin/keys", json.dumps({"name": "fleet-" + group, "group": group}),
              {"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    if r.status != 201:
        raise SystemExit("fleet: minting a key of %s failed: %d %s" % (group, r.status, body[:200]))
    return json.loads(body)["token"]


def load(bench, targets, tag, template, duration, headers=None):
    """wrk against every target at once, --connections split among them; a run dict per target."""
    path = payloads.path(CASE.ingress, run.LANES[CASE.egress])
    total = bench.conns
    bench.conns = max(1, total // len(targets))
    out = [None] * len(targets)

    def go(i, t):
        h = headers[i] if headers else bench.headers_for(t, CASE.ingress)
        # a body template of its own per instance: the wrk processes number their requests alike
        out[i] = bench.wrk(t, CASE, "%s-%d" % (tag, i), path, h,
                           template.replace(b"@SEQ@", b"i%d@SEQ@" % i), duration)
    try:
        threads = [threading.Thread(target=go, args=(i, t)) for i, t in enumerate(targets)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        bench.conns = total
    return out


def summary(runs):
    ok = [r for r in runs if r and "error" not in r]
    if len(ok) != len(runs):
        return {"error": next((r["error"] for r in runs if r and "error" in r), "no run")}
    req = sum(r["requests"] for r in ok)
    bad = sum(r["non2xx"] + r["socket_errors"] for r in ok)
    return {"requests": req, "rps": sum(r["rps"] for r in ok), "bad": bad,
            "cpu_us_per_req": sum(r["cpu_us"] for r in ok) / req if req else None,
            "first_bad": next((r["first_bad"] for r in ok if r["first_bad"]), "")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--limit", type=int, default=2000,
                    help="the exact group's requests per minute (the check needs more load than "
                    "this in 3 s)")
    ap.add_argument("--no-control", action="store_true", help="skip the keys-off rows")
    a = ap.parse_args()
    args = argparse.Namespace(quick=True, duration=a.duration, connections=a.connections,
                              no_litellm=True, observe="off", tls=False, keys="off", only=None,
                              baseline=None, baseline_patch=None, baseline_build_timeout=900,
                              no_c1=True, no_scaling=True, no_features=True, install_timeout=0,
                              stores=None)
    bench = FleetBench(args)
    bench.limit = a.limit
    for d in (bench.log_dir, bench.out_dir):     # Bench made run.py's folder; this one is ours
        try:
            d.rmdir()
        except OSError:
            pass
    bench.out_dir = run.BENCH / "results" / ("fleet-" + bench.out_dir.name)
    bench.log_dir = bench.out_dir / "logs"
    bench.log_dir.mkdir(parents=True, exist_ok=True)
    bench.procs = procs.Processes(str(bench.log_dir))
    os.sched_setaffinity(0, {bench.load_core})
    run.ensure_taskset()
    run.ensure_wrk()
    g, lc = bench.gw_core, bench.load_core
    results = {"rows": {}, "exact": None}
    try:
        env = bench.env()
        bench.mock_port = procs.free_port()
        bench.mock = bench.procs.start("mock", [run.PY, "-m", "busbar.cli", "mock", "--port",
                                                str(bench.mock_port), "--require-auth"], lc, env,
                                       str(run.ROOT))
        why = procs.wait_http(bench.mock_port, bench.mock.proc, "/healthz", 30)
        if why:
            raise SystemExit("fleet: mock %s" % why)
        sets = {"valkey": None} if a.no_control else {"valkey": None, "off": None}
        for keys in sets:
            one = bench.start_busbar("one-%s" % keys, "off", keys, core=str(g))
            a_ = bench.start_busbar("fleet-a-%s" % keys, "off", keys, core=str(g))
            b_ = bench.start_busbar("fleet-b-%s" % keys, "off", keys, core=str(lc))
            sets[keys] = (one, a_, b_)
            for t in (one, a_, b_):
                bench.targets[t.name] = t
        bench.targets["direct"] = run.Target("direct", bench.mock_port, bench.mock)
        time.sleep(1.0)
        template = payloads.body(CASE.ingress, run.LANES[CASE.egress], CASE.size)
        for one, a_, b_ in sets.values():
            for t in (one, a_, b_):      # warm: connections, caches, the key in each worker
                load(bench, [t], "warm", template, 1)
        for keys, (one, a_, b_) in sets.items():
            rows = {"one instance": [], "two instances": []}
            for r in range(a.rounds):
                run.log("fleet %s: round %d" % (keys, r + 1))
                rows["one instance"] += load(bench, [one], "one-%s-r%d" % (keys, r), template,
                                             a.duration)
                rows["two instances"] += load(bench, [a_, b_], "two-%s-r%d" % (keys, r), template,
                                              a.duration)
            for name, runs in rows.items():
                s = summary(runs)
                if "rps" in s:
                    s["rps"] /= a.rounds
                results["rows"]["%s, keys %s" % (name, "on Valkey" if keys == "valkey" else "off")] = s
        # exact: both instances, one key of the `exact` group, one minute window
        one, a_, b_ = sets["valkey"]
        key = mint(a_.admin_port, bench.admin_token, "exact")
        hdr = dict(bench.headers_for(a_, CASE.ingress))
        hdr["Authorization"] = "Bearer " + key
        sec = datetime.datetime.now().second
        if sec > 50:
            time.sleep(61 - sec)
        runs = load(bench, [a_, b_], "exact", template, 3, headers=[hdr, hdr])
        ok2xx = sum(r["requests"] - r["non2xx"] for r in runs if r and "error" not in r)
        sent = sum(r["requests"] for r in runs if r and "error" not in r)
        results["exact"] = {"limit": a.limit, "sent": sent, "admitted": ok2xx,
                            "exact": ok2xx == a.limit,
                            "refused_first": next((r["first_bad"] for r in runs if r and
                                                   r.get("first_bad")), "")}
    finally:
        bench.procs.stop_all()
    meta = {"commit": procs.git_head(), "cpu": procs.cpu_model(), "cores": os.cpu_count(),
            "command": shlex.join(getattr(sys, "orig_argv", [run.PY] + sys.argv)),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "duration_s": a.duration, "rounds": a.rounds, "connections": a.connections}
    results["meta"] = meta
    (bench.out_dir / "fleet.json").write_text(json.dumps(results, indent=1))
    print("busbar fleet — commit `%s` — %s (%d cores) — %s — `%s`\n" % (
        meta["commit"], meta["cpu"], meta["cores"], meta["date"][:16], meta["command"]))
    print("| arrangement | req/s (sum) | CPU µs/req (busbar, all instances) | non-2xx / errors |")
    print("|---|---:|---:|---:|")
    for name, s in results["rows"].items():
        if "error" in s:
            print("| %s | failed: %s | | |" % (name, s["error"]))
            continue
        print("| %s | %.0f | %.0f | %d |" % (name, s["rps"], s["cpu_us_per_req"], s["bad"]))
    e = results["exact"]
    print("\nOne instance on core %d; two instances: one on core %d, one on core %d with the mock, "
          "wrk and Valkey (this VM has two cores); %d wrk connections in all, split between the "
          "instances; %d s runs, %d rounds interleaved; small Anthropic → Anthropic calls, unique "
          "bodies." % (g, g, lc, a.connections, a.duration, a.rounds, ))
    print("\nExact limit across the fleet: a group of %d requests per minute, one key, both "
          "instances loaded for 3 s: %d sent, %d admitted (%s)." % (
              e["limit"], e["sent"], e["admitted"], "exact" if e["exact"] else "NOT exact"))
    run.log("wrote %s" % (bench.out_dir / "fleet.json").relative_to(run.ROOT))
    return 0 if e["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
