"""busbar's benchmark: busbar, the floor and LiteLLM's proxy against the same mock, same load, same run.

    .venv/bin/python bench/run.py [--quick] [--duration S] [--connections N] [--no-litellm]
                                  [--baseline REF [--baseline-patch FILE]] [--no-c1] [--no-scaling] [--no-features]

Prints markdown tables (with a header line naming the commit, CPU, date and command, and footers
saying how the cores were shared): the wrk and stream rows (busbar, the baseline with --baseline,
busbar with keys + metrics + access log on the small same-protocol case, the floor, LiteLLM,
direct), the concurrency-1 rows, the scaling rows and issue #13's targets; and writes them, the raw
JSON and every process log under bench/results/<timestamp>/. The tables are rendered from the JSON
alone (bench/report.py), as docs/performance.md's are from bench/published/ (bench/readme.py). What each
number means: bench/README.md. The rules: BENCHMARK.md.

It installs what it lacks (wrk from Debian, LiteLLM into bench/.venv-litellm), starts every process
it needs on 127.0.0.1 only, pinned with taskset (gateway under test on one core; mock, wrk and this
script on the other), and stops every one of them by pid when it ends, however it ends.
"""
from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import pathlib
import resource
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

try:
    import baseline  # noqa: E402
    import payloads  # noqa: E402
    import procs  # noqa: E402
    import report  # noqa: E402
    import ttfb  # noqa: E402
except ImportError as _e:  # orjson, httptools, uvloop: busbar's own venv has them
    sys.exit("bench: %s; run it with busbar's venv: .venv/bin/python bench/run.py" % (_e,))

PY = sys.executable
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_BIN = LITELLM_VENV / "bin" / "litellm"
LITELLM_MARK = LITELLM_VENV / ".bench-installed"
LOAD_LUA = BENCH / "load.lua"

# busbar's lanes, one per egress protocol, all on the mock, and their config (bench/payloads.py:
# packaging/pgo_train.py trains the profile-guided build on the same gateway).
LANES = payloads.LANES
PROTO_NAMES = {"openai": "OpenAI Chat", "responses": "Responses", "anthropic": "Anthropic",
               "gemini": "Gemini", "cohere": "Cohere v2", "bedrock": "Bedrock"}

BUSBAR_CONFIG = payloads.GATEWAY_CONFIG

SIZES = [("~8 tok / ~100 B", 100), ("~1k tok / ~4 KB", 4096), ("~12k tok / ~32 KB", 32768)]
ONE_K = SIZES[1]


_KNOWN = {}
# A config that uses each optional section the bench writes, in its "off" form.
_PROBE = {"admin_listen": 'admin_listen: "127.0.0.1:0"\n',
          "export": 'export: {access: {module: access-log, settings: {path: "off"}}}\n',
          "observability": "observability: {access_log: off, metrics: false}\n"}


def _knows(tree, key: str, env) -> bool:
    """Whether the busbar in `tree` (None: this one) accepts the config key `key`: its own
    `busbar validate` is asked about a minimal config with it (an older loader names a key it
    does not take in its error, so reading its source would not tell)."""
    if tree is None:
        return True
    if (str(tree), key) not in _KNOWN:
        import tempfile
        text = ('providers: {p: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: '
                '{env: BENCH_MOCK_KEY}}}\nmodels: {m: {provider: p, upstream_model: x}}\n')
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text + _PROBE[key])
        e = dict(env, PYTHONPATH=str(tree), BENCH_MOCK_KEY="k" * 20)
        try:
            p = subprocess.run([PY, "-m", "busbar.cli", "validate", "--config", f.name],
                               cwd=str(tree), env=e, capture_output=True, timeout=60)
            _KNOWN[(str(tree), key)] = not (p.returncode != 0 and key.encode() in p.stdout + p.stderr)
        finally:
            os.unlink(f.name)
    return _KNOWN[(str(tree), key)]


def hooked(text: str, url: str) -> str:
    """The bench config with every lane behind a pool of its own name and one gate hook on every
    pool (`pools.hooks`), so the bench's requests (which name the lanes) each ask the gate at
    `url` before their attempt. The gate answers at once; it is given a generous deadline and
    `on_error: nothing`, so the row measures the asking, never a timeout."""
    for lane in LANES.values():
        text = text.replace("  %s:" % lane, "  %s-lane:" % lane)
    pools = "".join("  %s: {members: [{model: %s-lane}]}\n" % (lane, lane) for lane in LANES.values())
    return text + ("hooks:\n  gate: {module: busbar-webrequest-hook, settings: {url: \"%s\"}, "
                   "timeout_ms: 1000, on_error: nothing}\npools:\n  hooks: [gate]\n%s" % (url, pools))


class Case:
    def __init__(self, ingress, egress, size, litellm):
        self.ingress = ingress
        self.egress = egress
        self.size_label, self.size = size
        self.litellm = litellm
        self.key = "%s-%s-%d" % (ingress, egress, self.size)

    @property
    def label(self):
        return "%s → %s, %s" % (PROTO_NAMES[self.ingress], PROTO_NAMES[self.egress], self.size_label)


def plan_cases(quick: bool):
    cases = []
    for pair in (("openai", "openai"), ("anthropic", "anthropic"), ("anthropic", "openai")):
        for size in SIZES:
            # LiteLLM serves OpenAI-compatible lanes: the OpenAI and the Anthropic-in rows (in quick
            # mode only at ~1k tokens, to stay in its time bound).
            lite = pair[1] == "openai" and (not quick or size == ONE_K)
            cases.append(Case(pair[0], pair[1], size, lite))
    for proto in ("responses", "gemini", "cohere", "bedrock"):
        cases.append(Case(proto, proto, ONE_K, False))
    return cases


STREAM_CASES = [("openai", "openai"), ("anthropic", "openai")]

# The features rows run on these cases next to the plain busbar row: busbar with metrics and the
# access log (what observability costs, issue #11), and busbar with virtual keys on a SQLite store
# as well (issue #13's features row).
FEATURES = "busbar+features"
FEATURES_LABEL = "busbar, keys (SQLite) + metrics + access log"
OBSERVE = "busbar+observe"
OBSERVE_LABEL = "busbar, metrics + access log"
# ...and busbar with one gate hook (`pools.hooks`) on a sidecar on loopback that abstains
# (bench/sidecar.py, on the load core): what asking a gate costs, issue #40.
HOOK = "busbar+hook"
HOOK_LABEL = "busbar, one gate hook on loopback"
FEATURES_CASES = ("anthropic-anthropic-100",)
# --stores: one more busbar per store on the same cases, with virtual keys on that store and
# nothing else changed from the busbar row (issue #41's fleet rows: keys on SQLite, on a loopback
# Valkey/Redis, on a loopback PostgreSQL, next to the keys-off busbar and the floor, one run).
STORES = ("sqlite", "valkey", "postgres")
STORE_NAMES = {"sqlite": "SQLite", "valkey": "Valkey", "postgres": "Postgres"}


def store_row(store):
    return "busbar+keys-%s" % store


def store_label(store):
    return "busbar, keys (%s)" % STORE_NAMES[store]


def keys_yaml(store):
    """busbar's config for virtual keys on `store` (its `store:` line): an admin token for minting,
    the ed25519 signing key, a group whose limits every request takes (requests per minute, a
    monthly budget, a concurrency cap, all far above the load) and a rate card, so a request pays
    for authentication, admission and settlement. The secrets come from the environment
    (BENCH_ADMIN_TOKEN, BENCH_SIGNING_KEY)."""
    card = "".join("  %s: {input_utok: 3.0, output_utok: 15.0}\n" % m for m in
                   ("oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model"))
    return ("identity-providers:\n  bench: {module: admin-tokens, token: {env: BENCH_ADMIN_TOKEN}}\n"
            "auth:\n  chain: [keys]\n  signing_key: {env: BENCH_SIGNING_KEY}\n"
            "  admin_auth: [bench]\n"
            "groups:\n  bench: {limits: [{requests: 100000000, per: minute}, "
            "{budget: 10000000000, per: month}, {concurrent: 100000}]}\n"
            "rate_card:\n" + card + store)

# The scaling rows: busbar with --workers 1 and --workers 2 on these cases, unpinned.
SCALING_CASES = (("anthropic", "anthropic", SIZES[0]), ("anthropic", "openai", ONE_K))


# --------------------------------------------------------------------------------------- small utils

def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def pct(sorted_vals, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------------- installs

def ensure_wrk():
    if shutil.which("wrk"):
        return
    log("wrk is missing: apt-get install -y wrk")
    cmd = ["apt-get", "install", "-y", "-q", "wrk"]
    ok = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        timeout=300).returncode == 0
    if not ok:
        subprocess.run(["apt-get", "update", "-q"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    if not shutil.which("wrk"):
        sys.exit("bench: wrk could not be installed (apt-get install -y wrk failed); it is the load "
                 "driver, nothing can be measured without it")


def ensure_taskset():
    if not shutil.which("taskset"):
        subprocess.run(["apt-get", "install", "-y", "-q", "util-linux"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
    if not shutil.which("taskset"):
        sys.exit("bench: taskset (util-linux) is missing and could not be installed")


def ensure_litellm(log_dir, timeout):
    """None when LiteLLM's proxy is installed in bench/.venv-litellm, else why not."""
    if LITELLM_MARK.exists() and LITELLM_BIN.exists():
        return None
    log("installing LiteLLM into %s (pip install 'litellm[proxy]', bounded at %d s)"
        % (LITELLM_VENV.relative_to(ROOT), timeout))
    out = open(os.path.join(log_dir, "litellm-install.log"), "wb")
    deadline = time.monotonic() + timeout
    try:
        if not (LITELLM_VENV / "bin" / "python").exists():
            subprocess.run([PY, "-m", "venv", str(LITELLM_VENV)], stdout=out, stderr=out,
                           check=True, timeout=120)
        rest = max(10, deadline - time.monotonic())
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
                       stdout=out, stderr=out, check=True, timeout=rest)
    except subprocess.TimeoutExpired:
        return "install did not finish within %d s" % timeout
    except (subprocess.CalledProcessError, OSError) as e:
        return "install failed (%s; see litellm-install.log)" % (e,)
    finally:
        out.close()
    if not LITELLM_BIN.exists():
        return "install finished but %s is missing" % LITELLM_BIN.relative_to(ROOT)
    LITELLM_MARK.write_text("ok\n")
    return None


# --------------------------------------------------------------------------------------- the bench

def make_cert(folder):
    """A self-signed ECDSA P-256 certificate for 127.0.0.1 (--tls): (cert path, key path)."""
    import datetime as _dt
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "busbar-bench")])
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5)).not_valid_after(now + _dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cpath, kpath = pathlib.Path(folder) / "tls.crt", pathlib.Path(folder) / "tls.key"
    cpath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kpath.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    os.chmod(kpath, 0o600)
    return cpath, kpath


class StartError(Exception):
    """A gateway did not come up (its name, why, the end of its log)."""


class Target:
    """One gateway (or the mock itself, "direct") as the load driver sees it."""

    def __init__(self, name, port, started, headers_extra=None, tls=False):
        self.name = name
        self.port = port
        self.tls = tls                  # served over TLS (--tls: busbar and the floor)
        self.started = started          # procs.Started whose CPU/RSS is measured
        self.headers_extra = headers_extra or {}
        self.failed = None              # why it is not measured at all
        self.rss_idle = 0
        self.pss_idle = 0


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.duration = args.duration or (1 if self.quick else 5)
        self.rounds = 2
        self.conns = args.connections
        self.bound = 180.0 if self.quick else 600.0
        cores = sorted(os.sched_getaffinity(0))
        self.all_cores = ",".join(str(c) for c in cores)
        self.gw_core = cores[0]
        self.load_core = cores[1] if len(cores) > 1 else cores[0]
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        self.out_dir = BENCH / "results" / stamp
        self.log_dir = self.out_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = procs.Processes(str(self.log_dir))
        self.sampler = procs.RssSampler()
        self.targets = {}
        self.mock = None
        self.results = {"cases": [], "stream": [], "scaling": [], "notes": []}
        self.started_at = time.monotonic()
        self.deadline = None
        self.after_times = {}
        e = dict(os.environ)
        e["PYTHONPATH"] = str(ROOT)
        e.update(payloads.MOCK_ENV)
        e["NO_PROXY"] = e["no_proxy"] = "127.0.0.1,localhost"
        e.setdefault("BUSBAR_LOG", "WARNING")
        self.base_env = e
        self.tls_files = None
        self.redis_url = None
        self.redis_db = 0
        self.pg = None                  # tests/postgres_server.PostgresServer with keys on postgres
        self.pg_dbs = 0
        self.stores = [x for x in (args.stores or "").split(",") if x]
        self.mock_port = None
        self.baseline_ref = args.baseline
        self.baseline = None            # baseline.Baseline with --baseline
        # The features rows: busbar with metrics and the access log, and with keys (SQLite) too, on
        # the small same-protocol case, unless the main busbar has features on already.
        self.features = (args.keys == "off" and args.observe == "off" and not args.no_features)

    # ---------------------------------------------------------------- processes
    def env(self):
        """The environment of every process the run starts (a copy: callers may change it)."""
        return dict(self.base_env)

    def busbar_config(self, port, admin_port, observe, keys, tag, tree=None, hook=None):
        """The config of one busbar instance: the six lanes on the mock, Server-Timing on, its own
        admin port (a default one could be taken by anything else on the machine), the access log
        and metrics per `observe`, virtual keys per `keys`, TLS when --tls. For a --baseline tree
        from before a section existed (no admin listener, no access log), the section is left out
        when it would only say what that busbar did anyway."""
        o = observe
        text = BUSBAR_CONFIG.format(port=port, mock=self.mock_port)
        if hook is not None:
            text = hooked(text, hook)
        if _knows(tree, "admin_listen", self.env()):
            text += "admin_listen: \"127.0.0.1:%d\"\n" % admin_port
        access = '"%s"' % (self.log_dir / ("access-%s.jsonl" % tag)) if o in ("on", "access") \
            else '"off"'
        if _knows(tree, "export", self.env()):
            text += "export:\n  access: {module: access-log, settings: {path: %s}}\n" % access
            if o in ("on", "metrics"):
                text += "  metrics: {module: prometheus, settings: {buffer_seconds: 60}}\n"
        elif o != "off" or _knows(tree, "observability", self.env()):
            # a --baseline tree from before the export: grammar (issue #36) reads busbar's
            # earlier spelling of the same settings
            text += "observability: {access_log: %s, metrics: %s}\n" % (
                access, "true" if o in ("on", "metrics") else "false")
        text += self.keys_config(keys, tag)
        if self.tls_files:
            text += "tls: {cert: {file: \"%s\"}, key: {file: \"%s\"}}\n" % self.tls_files
        return text

    def start_busbar(self, name, observe, keys, workers=1, core=None, tree=None, hook=None):
        """Starts one busbar (this tree's, or `tree`'s for --baseline) and waits for /healthz; a
        Target, with its virtual key minted when keys are on. Raises StartError with the log."""
        tag = name.replace("@", "-").replace("+", "-").replace(" ", "-")
        port, admin_port = procs.free_port(), procs.free_port()
        cfg = self.log_dir / ("%s.yaml" % tag)
        cfg.write_text(self.busbar_config(port, admin_port, observe, keys, tag, tree, hook))
        env = self.env()            # after the config: keys_config puts its secrets in it
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        argv = [PY, "-m", "busbar.cli", "serve", "--config", str(cfg)]
        if workers:
            argv += ["--workers", str(workers)]
        s = self.procs.start(tag, argv, self.gw_core if core is None else core, env,
                             str(tree or ROOT))
        why = procs.wait_http(port, s.proc, "/healthz", 30, tls=bool(self.tls_files))
        if why:
            raise StartError("%s %s; log: %s" % (name, why, s.log_tail()))
        t = Target(name, port, s, tls=bool(self.tls_files))
        t.admin_port = admin_port
        if keys != "off":
            # the bench caller's virtual key, minted through the admin API like a user would
            t.headers_extra = {"Authorization": "Bearer " + self.mint_key(admin_port)}
        return t

    def start_all(self, litellm_ready):
        env = self.env()
        mock_port, floor_port = procs.free_port(), procs.free_port()
        self.mock_port = mock_port
        # --require-auth: each request must carry its protocol's credential (Bedrock: a SigV4
        # Authorization header), so a gateway that skipped signing would fail rather than look fast.
        self.mock = self.procs.start("mock", [PY, "-m", "busbar.cli", "mock", "--port", str(mock_port),
                                              "--require-auth"], self.load_core, env, str(ROOT))
        why = procs.wait_http(mock_port, self.mock.proc, "/healthz", 30)
        if why:
            raise SystemExit("bench: mock %s; log: %s" % (why, self.mock.log_tail()))
        floor_tls = []
        if self.args.tls:
            # --tls: busbar and the floor serve the same self-signed certificate on the same TLS
            # stack (busbar.config.control.ssl_context); wrk speaks HTTPS over keep-alive.
            cert, key = make_cert(self.log_dir)
            self.tls_files = (str(cert), str(key))
            floor_tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
        tls = bool(self.tls_files)
        # The gateways: busbar as configured by --observe/--keys; the baseline (--baseline) with the
        # same config; busbar with metrics + access log, and with every feature on, for the features
        # rows; the floor.
        try:
            self.targets["busbar"] = self.start_busbar("busbar", self.args.observe, self.args.keys)
        except StartError as e:
            raise SystemExit("bench: %s" % e) from None
        if self.baseline is not None:
            b = self.baseline
            try:
                t = self.start_busbar(b.name, self.args.observe, self.args.keys, tree=b.tree)
            except StartError as e:
                raise SystemExit(
                    "bench: the baseline %s (--baseline %s, tree %s) did not start with the bench "
                    "config; if its config schema rejects a key this commit's bench writes (e.g. "
                    "admin_listen, export, auth, store), it cannot be compared with this "
                    "bench. %s" % (b.name, b.ref, b.tree.relative_to(ROOT), e)) from None
            t.started.refresh()
            if not baseline.loaded_from(t.started.pids, b.tree):
                raise SystemExit("bench: the baseline %s does not run its own extensions (none of "
                                 "%s's cbusbar .so files is mapped): refusing to compare"
                                 % (b.name, b.tree.relative_to(ROOT)))
            self.targets[b.name] = t
        if self.features:
            try:
                self.targets[OBSERVE] = self.start_busbar(OBSERVE, "on", "off")
                self.targets[FEATURES] = self.start_busbar(FEATURES, "on", "sqlite")
            except StartError as e:
                raise SystemExit("bench: %s" % e) from None
            side_port = procs.free_port()
            side = self.procs.start("sidecar", [PY, str(BENCH / "sidecar.py"), "--listen",
                                                "127.0.0.1:%d" % side_port], self.load_core, env,
                                    str(ROOT))
            why = procs.wait_http(side_port, side.proc, "/healthz", 30)
            if why:
                raise SystemExit("bench: sidecar %s; log: %s" % (why, side.log_tail()))
            try:
                self.targets[HOOK] = self.start_busbar(HOOK, "off", "off",
                                                       hook="http://127.0.0.1:%d/gate" % side_port)
            except StartError as e:
                raise SystemExit("bench: %s" % e) from None
        for st in self.stores:
            try:
                self.targets[store_row(st)] = self.start_busbar(store_row(st), self.args.observe, st)
            except StartError as e:
                raise SystemExit("bench: %s" % e) from None
        fl = self.procs.start("floor", [PY, str(BENCH / "floor.py"), "--listen",
                                        "127.0.0.1:%d" % floor_port, "--upstream",
                                        "127.0.0.1:%d" % mock_port] + floor_tls, self.gw_core, env,
                              str(ROOT))
        why = procs.wait_http(floor_port, fl.proc, "/healthz", 30, tls=tls)
        if why:
            raise SystemExit("bench: floor %s; log: %s" % (why, fl.log_tail()))
        self.targets["floor"] = Target("floor", floor_port, fl, tls=tls)
        self.targets["direct"] = Target("direct", mock_port, self.mock)
        lt = Target("LiteLLM", 0, None)
        self.targets["LiteLLM"] = lt
        if litellm_ready is not None:
            lt.failed = litellm_ready
        else:
            port = procs.free_port()
            key = "sk-" + secrets.token_hex(24)
            lenv = dict(env, BENCH_MOCK_OPENAI_BASE="http://127.0.0.1:%d/v1" % mock_port,
                        LITELLM_MASTER_KEY=key, LITELLM_LOCAL_MODEL_COST_MAP="True",
                        LITELLM_LOG="ERROR")
            lenv.pop("PYTHONPATH", None)
            s = self.procs.start("litellm", [str(LITELLM_BIN), "--config", str(BENCH / "litellm.yaml"),
                                             "--host", "127.0.0.1", "--port", str(port),
                                             "--num_workers", "1"], self.gw_core, lenv, str(BENCH))
            bound = 60 if self.quick else 90
            log("waiting for LiteLLM's proxy to start (bounded at %d s)" % bound)
            t0 = time.monotonic()
            why = procs.wait_http(port, s.proc, "/health/liveliness", bound)
            if why:
                lt.failed = "%s (log: %s)" % (why, s.log_tail(3)[:300])
            else:
                log("LiteLLM up after %.1f s" % (time.monotonic() - t0))
                lt.port, lt.started = port, s
                lt.headers_extra = {"Authorization": "Bearer " + key}
        # Idle RSS and PSS: everything up, nothing sent yet. A moment first, so start-up work has
        # settled.
        time.sleep(2.0)
        for t in self.targets.values():
            if t.started is not None and not t.failed:
                t.started.refresh()
                t.rss_idle = t.started.rss_kib()
                t.pss_idle = t.started.pss_kib()
                if t.name != "direct":
                    self.sampler.watch(t.name, t.started)
        self.sampler.start()

    def keys_config(self, keys, tag):
        """Virtual keys on (`keys` sqlite, valkey or postgres): keys_yaml with the store's line.
        Each busbar gets its own SQLite file; with valkey, one loopback redis-server (a database
        per busbar); with postgres, one throwaway loopback cluster (tests/postgres_server.py,
        fsync off; a database per busbar). The key each request carries is ed25519-signed, minted
        through the admin API into the store (mint_key)."""
        if keys == "off":
            return ""
        env = self.base_env
        env.setdefault("BENCH_SIGNING_KEY", secrets.token_hex(32))
        env.setdefault("BENCH_ADMIN_TOKEN", secrets.token_hex(16))
        self.admin_token = env["BENCH_ADMIN_TOKEN"]
        return keys_yaml(self.store_yaml(keys, tag))

    def store_yaml(self, keys, tag):
        """The config's `store:` line for `keys`, starting the loopback server it names the first
        time (its URL goes into the environment, as a secret would). Both servers run on the load
        core (redis-server pinned; PostgreSQL inherits run.py's own affinity) and are stopped when
        the run ends (self.procs, stop_stores)."""
        env = self.base_env
        if keys in ("valkey", "redis"):
            if self.redis_url is None:
                binary = shutil.which("redis-server") or "/usr/bin/redis-server"
                if not os.access(binary, os.X_OK):
                    raise SystemExit("bench: keys on valkey need redis-server (make redis "
                                     "installs Debian's package)")
                rport = procs.free_port()
                self.redis = self.procs.start("redis", [binary, "--port", str(rport), "--bind",
                                                        "127.0.0.1", "--save", "", "--appendonly", "no"],
                                              self.load_core, self.env(), str(self.log_dir))
                import socket
                deadline = time.monotonic() + 10
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", rport), 0.2).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise SystemExit("bench: redis-server did not start") from None
                        time.sleep(0.05)
                self.redis_url = "redis://127.0.0.1:%d" % rport
            self.redis_db += 1
            var = "BENCH_REDIS_URL_%d" % self.redis_db
            env[var] = "%s/%d" % (self.redis_url, self.redis_db - 1)
            return "store: {module: valkey, settings: {url: {env: %s}}}\n" % var
        if keys == "postgres":
            if self.pg is None:
                if str(ROOT) not in sys.path:
                    sys.path.append(str(ROOT))
                from tests.postgres_server import PostgresServer
                try:
                    self.pg = PostgresServer()
                except FileNotFoundError as e:
                    raise SystemExit("bench: keys on postgres: %s" % e) from None
                log("starting a loopback PostgreSQL on port %d" % self.pg.port)
                try:
                    self.pg.start()
                except Exception as e:  # initdb's or pg_ctl's own message
                    raise SystemExit("bench: PostgreSQL did not start: %s" % e) from None
            self.pg_dbs += 1
            var = "BENCH_PG_URL_%d" % self.pg_dbs
            env[var] = self.pg.create_database("bench_%d" % self.pg_dbs)
            return "store: {module: postgres, settings: {url: {env: %s}}}\n" % var
        return "store: {module: sqlite, settings: {db_path: \"%s\"}}\n" % (
            self.log_dir / ("%s.db" % tag))

    def stop_stores(self):
        """Stops and deletes the loopback PostgreSQL cluster if this run started one
        (redis-server is one of self.procs and stops with them)."""
        if self.pg is not None:
            try:
                self.pg.close()
            except Exception as e:  # pg_ctl's message; the cluster's folder is removed anyway
                log("stopping PostgreSQL: %s" % e)
            self.pg = None

    def mint_key(self, port):
        import http.client
        import json as _json
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/api/v1/admin/keys", _json.dumps({"name": "bench", "group": "bench"}),
                  {"Authorization": "Bearer " + self.admin_token, "Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 201:
            raise SystemExit("bench: minting the bench key failed: %d %s" % (r.status, body[:200]))
        return _json.loads(body)["token"]

    # ---------------------------------------------------------------- requests
    def headers_for(self, target, proto):
        h = payloads.headers(proto)
        if target.headers_extra:
            # LiteLLM authenticates callers with its master key (Bearer), whatever the protocol;
            # busbar with --keys takes its virtual key the same way.
            for k in ("Authorization", "x-api-key", "x-goog-api-key"):
                h.pop(k, None)
            h.update(target.headers_extra)
        return h

    def preflight(self, target, path, headers, template):
        """None if one request answers 2xx, else why not (status and the start of the body)."""
        body = template.replace(b"@SEQ@", b"preflight")
        try:
            if target.tls:
                c = http.client.HTTPSConnection("127.0.0.1", target.port, timeout=60,
                                                context=procs.insecure_tls())
            else:
                c = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
            c.request("POST", path, body=body, headers=headers)
            r = c.getresponse()
            data = r.read()
            c.close()
        except (OSError, http.client.HTTPException) as e:
            return "request failed: %s" % (e,)
        if not 200 <= r.status < 300:
            return "HTTP %d: %s" % (r.status, data[:200].decode("utf-8", "replace"))
        return None

    def wrk(self, target, case, tag, path, headers, template, duration):
        """One wrk run against `target`; a dict of what it measured."""
        ckey = case.key if case else "warmup"
        base = self.log_dir / ("%s-%s-%s" % (ckey, target.name, tag))
        body_file = self.log_dir / ("%s.body" % ckey)
        hdr_file = self.log_dir / ("%s-%s.headers" % (ckey, target.name))
        if not body_file.exists():
            body_file.write_bytes(template)
        hdr_file.write_text("".join("%s: %s\n" % kv for kv in headers.items()))
        base.with_suffix(".json").unlink(missing_ok=True)
        env = dict(os.environ, BENCH_BODY=str(body_file), BENCH_PATH=path,
                   BENCH_HEADERS=str(hdr_file), BENCH_OUT=str(base))
        others = [t for t in self.targets.values()
                  if t is not target and t.started is not None and t.name != "direct" and not t.failed]
        for t in [target] + others:
            if t.started is not None:
                t.started.refresh()
        cpu0 = target.started.cpu_ticks()
        other0 = {t.name: t.started.cpu_ticks() for t in others}
        mock0 = self.mock.cpu_ticks()
        ch0 = children_cpu_s()
        t0 = time.monotonic()
        cmd = ["taskset", "-c", str(self.load_core), "wrk", "-t1", "-c", str(self.conns),
               "-d", "%ds" % duration, "--timeout", "10s", "-s", str(LOAD_LUA),
               "%s://127.0.0.1:%d" % ("https" if target.tls else "http", target.port)]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, timeout=duration + 60)
        except subprocess.TimeoutExpired:
            return {"error": "wrk did not finish within %g s" % (duration + 60)}
        t1 = time.monotonic()
        cpu1 = target.started.cpu_ticks()
        mock1 = self.mock.cpu_ticks()
        wrk_cpu = children_cpu_s() - ch0
        target.started.settle()
        base.with_suffix(".wrk.txt").write_bytes(p.stdout + p.stderr)
        try:
            w = json.loads(base.with_suffix(".json").read_text())
        except (OSError, ValueError):
            return {"error": "wrk failed (exit %d): %s" % (p.returncode,
                                                           (p.stderr or p.stdout)[-300:].decode("utf-8", "replace"))}
        try:
            # One Server-Timing value per response: summarised below, not kept (tens of MB a run).
            durs = [float(x) for x in base.with_suffix(".dur").read_text().split()]
            base.with_suffix(".dur").unlink()
        except OSError:
            durs = []
        wall = t1 - t0
        req = w["requests"]
        if not req:
            return {"error": "no request completed in %d s (errors: %s)" % (duration, w["errors"])}
        tick_us = 1e6 / procs.CLK_TCK
        cpu_us = (cpu1 - cpu0) * tick_us
        mock_us = (mock1 - mock0) * tick_us
        errs = w["errors"]
        sock_errors = errs["connect"] + errs["read"] + errs["write"] + errs["timeout"]
        run = {
            "gateway": target.name, "tag": tag, "t_start": t0, "t_end": t1,
            "requests": req, "duration_s": w["duration_us"] / 1e6,
            "rps": req / (w["duration_us"] / 1e6) if w["duration_us"] else 0.0,
            "non2xx": w["non2xx"], "first_bad": w["first_bad"], "errors": errs,
            "socket_errors": sock_errors,
            "latency_us": w["latency_us"],
            "cpu_us": cpu_us, "cpu_us_per_req": cpu_us / req if req else None,
            "mock_cpu_us_per_req": mock_us / req if req else None,
            "gateway_core_busy": cpu_us / 1e6 / wall if wall else None,
            "load_core_busy": (mock_us / 1e6 + wrk_cpu) / wall if wall else None,
            "others_cpu_ms": {n: (t.started.cpu_ticks() - other0[n]) * tick_us / 1000
                              for n, t in ((t.name, t) for t in others)},
            "durs_ms": durs,
        }
        return run

    # ---------------------------------------------------------------- phases
    def warmup(self):
        proto = "openai"
        template = payloads.body(proto, LANES[proto], ONE_K[1])
        for t in self.targets.values():
            if t.name == "direct" or t.failed:
                continue
            path = payloads.path(proto, LANES[proto])
            why = self.preflight(t, path, self.headers_for(t, proto), template)
            if why:
                # Not measured at all: its stream and concurrency-1 requests would each fail too,
                # slowly (LiteLLM retries an unreachable upstream), and eat the run's time bound.
                log("warmup preflight for %s failed: %s" % (t.name, why))
                t.failed = "its warm-up request failed: %s" % why[:200]
                continue
            self.wrk(t, None, "warm", path, self.headers_for(t, proto), template,
                     2 if t.name == "LiteLLM" else 1)

    def run_case(self, case):
        log("case %s%s" % (case.label, " over TLS" if self.args.tls else ""))
        model = LANES[case.egress]
        template = payloads.body(case.ingress, model, case.size)
        path = payloads.path(case.ingress, model)
        label = case.label + (", TLS (busbar and floor)" if self.args.tls else "")
        entry = {"key": case.key, "label": label, "ingress": case.ingress,
                 "egress": case.egress, "body_bytes": len(template) - len(payloads.MARK),
                 "path": path, "rows": {}, "runs": []}
        names = self.gateway_names(case) + (["LiteLLM"] if case.litellm else []) + ["direct"]
        skip = {}
        for n in names:
            t = self.targets[n]
            if t.failed:
                skip[n] = "not measured: " + t.failed
                continue
            if t.started is not None and not t.started.alive():
                skip[n] = "process exited (code %s): %s" % (t.started.proc.returncode,
                                                            t.started.log_tail(3))
                continue
            why = self.preflight(t, path, self.headers_for(t, case.ingress), template)
            if why:
                skip[n] = "failed preflight: " + why
        order = []
        for r in range(self.rounds):
            order += [n for n in names if n != "direct" and n not in skip]
            if r == 0 and "direct" not in skip:
                order.append("direct")
        for i, n in enumerate(order):
            if time.monotonic() > self.deadline:
                self.results["notes"].append("time bound reached: later runs of %s were skipped"
                                             % case.label)
                break
            t = self.targets[n]
            run = self.wrk(t, case, "r%d" % i, path, self.headers_for(t, case.ingress), template,
                           self.duration)
            if "error" in run:
                skip.setdefault(n, run["error"])
                continue
            entry["runs"].append(run)
        for n in names:
            entry["rows"][n] = self.summarise(case, n, entry["runs"], skip.get(n))
        for run in entry["runs"]:
            run["durs_count"] = len(run.pop("durs_ms"))
        if not self.args.no_c1:
            entry["c1"] = self.run_c1(case, [n for n in names if n != "LiteLLM" and n not in skip],
                                      path, template)
        self.results["cases"].append(entry)

    def gateway_names(self, case):
        """The gateways of a case besides LiteLLM and direct, in their interleaving order."""
        names = ["busbar"]
        if self.baseline is not None:
            names.append(self.baseline.name)
        if self.features and case is not None and case.key in FEATURES_CASES:
            names += [OBSERVE, FEATURES, HOOK]
        if case is not None and case.key in FEATURES_CASES:
            names += [store_row(st) for st in self.stores]
        return names + ["floor"]

    def run_c1(self, case, names, path, template):
        """Concurrency 1: `n` requests per gateway sent one at a time, interleaved request by
        request (direct first in every round, then busbar, [baseline, observe, features,] floor in
        balanced orders, ttfb.measure says why), each
        gateway on its own keep-alive connection. After each request the client waits until that
        gateway and the mock are idle, so no request overlaps another's leftover work. Latency = request written
        -> arrival of the response's first body byte (kernel receive timestamp; these answers are
        under 1 KB, one segment, so it is the response's arrival). Added latency = gateway minus
        the direct request of the same round (paired)."""
        n = 200 if self.quick else 1000
        warm = 20
        if self.args.tls:
            return {"skipped": "--tls: the concurrency-1 client speaks plain HTTP"}
        if time.monotonic() > self.deadline:
            self.results["notes"].append("time bound reached: concurrency 1 of %s skipped" % case.label)
            return {"skipped": "time bound reached"}
        order = ["direct"] + [nm for nm in names if nm != "direct"]
        if "direct" not in names:
            return {"skipped": "direct did not answer"}
        targets = {nm: (self.targets[nm].port, path, self.headers_for(self.targets[nm], case.ingress),
                        template) for nm in order}
        quiet_on = {nm: [self.targets[nm].started, self.mock] if nm != "direct" else [self.mock]
                    for nm in order}
        for nm in order:
            self.targets[nm].started.refresh()

        def quiet(name):
            procs.wait_idle(quiet_on[name], window=0.001, bound=0.05)
        t0 = time.monotonic()
        samples, errors = ttfb.measure(targets, n, warmup=warm, after_each=quiet, rotate=True)
        out = {"n": n, "warmup": warm, "seconds": round(time.monotonic() - t0, 1), "rows": {}}
        direct = samples.get("direct", [])
        for nm in order[1:] + order[:1]:
            out["rows"][nm] = c1_row(samples.get(nm, []), direct if nm != "direct" else None,
                                     errors.get(nm))
        return out

    def summarise(self, case, name, runs, skipped, after=True):
        mine = [r for r in runs if r["gateway"] == name]
        if not mine:
            return {"skipped": skipped or "not run"}
        req = sum(r["requests"] for r in mine)
        secs = sum(r["duration_s"] for r in mine)
        durs = sorted(d for r in mine for d in r["durs_ms"])
        bad = sum(r["non2xx"] for r in mine)
        sock = sum(r["socket_errors"] for r in mine)
        row = {
            "runs": len(mine), "requests": req, "rps": req / secs if secs else 0.0,
            "non2xx": bad, "socket_errors": sock,
            "first_bad": next((r["first_bad"] for r in mine if r["first_bad"]), ""),
            "cpu_us_per_req": sum(r["cpu_us"] for r in mine) / req if req else None,
            "dur_us": _dur_summary(durs),
            "latency_ms": {"p50": statistics.mean(r["latency_us"]["p50"] for r in mine) / 1000,
                           "p99": statistics.mean(r["latency_us"]["p99"] for r in mine) / 1000},
            "gateway_core_busy": statistics.mean(r["gateway_core_busy"] for r in mine),
            "load_core_busy": statistics.mean(r["load_core_busy"] for r in mine),
            "mock_cpu_us_per_req": statistics.mean(r["mock_cpu_us_per_req"] for r in mine),
        }
        if skipped:
            row["partial"] = skipped
        if name != "direct":
            row["rss_load_kib"] = max(self.sampler.peak(name, r["t_start"], r["t_end"]) for r in mine)
        if name != "direct" and after:
            t_after = max(r["t_end"] for r in mine) + 5.0
            row["rss_after_at"] = t_after
            self.after_times.setdefault(name, []).append((case.key, t_after))
        return row

    def run_scaling(self):
        """req/s and CPU µs/req of busbar with --workers 1 and --workers 2, both allowed on every
        core (no pin), the mock and wrk still pinned to the load core, interleaved w1, w2, w1, w2
        per case; idle RSS and PSS of each process tree before any load."""
        cases = [Case(i, e, size, False) for i, e, size in SCALING_CASES]
        if self.args.only:
            cases = [c for c in cases if any(k in c.key for k in self.args.only.split(","))]
        if self.args.no_scaling or not cases:
            return
        if self.args.tls:
            self.results["notes"].append("--tls: the scaling rows are not measured")
            return
        if time.monotonic() > self.deadline:
            self.results["notes"].append("time bound reached: scaling rows skipped")
            return
        log("scaling: busbar --workers 1 and --workers 2 on cores %s" % self.all_cores)
        gws = []
        try:
            for w in (1, 2):
                name = "busbar --workers %d" % w
                try:
                    t = self.start_busbar(name, self.args.observe, self.args.keys, workers=w,
                                          core=self.all_cores)
                except StartError as e:
                    self.results["notes"].append("scaling: %s" % e)
                    return
                t.workers = w
                gws.append(t)
            time.sleep(2.0)
            idle = {}
            for t in gws:
                t.started.refresh()
                roll = t.started.rollup_kib()
                idle[t.name] = {"workers": t.workers, "processes": len(t.started.pids),
                                "rss_idle_kib": t.started.rss_kib(),
                                "pss_idle_kib": roll.get("Pss", 0),
                                "pss_anon_idle_kib": roll.get("Pss_Anon", 0),
                                "pss_file_idle_kib": roll.get("Pss_File", 0)}
                self.sampler.watch(t.name, t.started)
            for case in cases:
                if time.monotonic() > self.deadline:
                    self.results["notes"].append("time bound reached: scaling of %s skipped"
                                                 % case.label)
                    break
                log("scaling: %s" % case.label)
                template = payloads.body(case.ingress, LANES[case.egress], case.size)
                path = payloads.path(case.ingress, LANES[case.egress])
                entry = {"key": case.key, "label": case.label, "cores": self.all_cores, "rows": {},
                         "runs": []}
                skip = {}
                for t in gws:
                    why = self.preflight(t, path, self.headers_for(t, case.ingress), template)
                    if why:
                        skip[t.name] = "failed preflight: " + why
                for r in range(self.rounds):
                    for t in gws:
                        if t.name in skip:
                            continue
                        run = self.wrk(t, case, "s%d" % r, path, self.headers_for(t, case.ingress),
                                       template, self.duration)
                        if "error" in run:
                            skip.setdefault(t.name, run["error"])
                            continue
                        entry["runs"].append(run)
                for t in gws:
                    row = self.summarise(case, t.name, entry["runs"], skip.get(t.name), after=False)
                    row.update(idle[t.name])
                    entry["rows"][t.name] = row
                for run in entry["runs"]:
                    run["durs_count"] = len(run.pop("durs_ms"))
                self.results["scaling"].append(entry)
        finally:
            for t in gws:
                self.procs.stop(t.started)

    def fill_rss_after(self):
        """RSS ~5 s after each gateway's last run of a case: sampled while the others ran."""
        if self.after_times:
            last = max(t for v in self.after_times.values() for _, t in v)
            wait = last + 0.3 - time.monotonic()
            if wait > 0:
                log("waiting %.1f s for the last after-load RSS sample" % wait)
                time.sleep(wait)
        for entry in self.results["cases"]:
            for name, row in entry["rows"].items():
                if "rss_after_at" in row:
                    row["rss_after_kib"] = self.sampler.at(name, row.pop("rss_after_at"))

    def run_streams(self):
        n = 100 if self.quick else 200
        if self.args.tls:
            self.results["notes"].append("--tls: the streaming TTFB rows are not measured (their "
                                         "client speaks plain HTTP)")
            return
        for ingress, egress in STREAM_CASES:
            if time.monotonic() > self.deadline:
                self.results["notes"].append("time bound reached: streaming TTFB skipped")
                return
            model = LANES[egress]
            label = "stream TTFB: %s → %s, %s" % (PROTO_NAMES[ingress], PROTO_NAMES[egress],
                                                  ONE_K[0])
            log(label)
            template = payloads.body(ingress, model, ONE_K[1], stream=True)
            path = payloads.path(ingress, model, stream=True)
            names = ["direct"] + [nm for nm in self.gateway_names(None)] + (
                ["LiteLLM"] if not self.targets["LiteLLM"].failed else [])
            targets = {}
            for name in names:
                t = self.targets[name]
                targets[name] = (t.port, path, self.headers_for(t, ingress), template)
            for t in self.targets.values():
                if t.started is not None and not t.failed:
                    t.started.refresh()
            # Few requests: on-CPU ns from schedstat, as clock ticks would be too coarse here.
            cpu0 = {nm: self.targets[nm].started.cpu_ns() for nm in names}
            warm = 5
            quiet_on = {nm: [self.targets[nm].started, self.mock] for nm in names}

            def quiet(name):
                # Sequential requests must not overlap: LiteLLM goes on working (and reading the
                # mock's stream) after its last byte reached the client, which showed up as ~0.8 ms
                # on whichever request came next. Wait until the gateway and the mock are idle.
                procs.wait_idle(quiet_on[name], window=0.005, bound=0.5)
            samples, errors = ttfb.measure(targets, n, warmup=warm, after_each=quiet, rotate=True)
            cpu1 = {nm: self.targets[nm].started.cpu_ns() for nm in names}
            direct = samples.get("direct", [])
            entry = {"label": label, "ingress": ingress, "egress": egress, "n": n, "rows": {}}
            for name in names[1:] + names[:1]:     # direct last, as in the other rows
                s = samples.get(name, [])
                row = {"samples": len(s), "kernel_stamped": sum(1 for x in s if x[5])}
                if name in errors:
                    row["error"] = errors[name]
                bad = [x for x in s if not 200 <= x[2] < 300]
                if bad:
                    row["non2xx"] = len(bad)
                    row["first_bad"] = "%d %s" % (bad[0][2], bad[0][4][:200].decode("utf-8", "replace"))
                if s:
                    tt = sorted(x[0] / 1000 for x in s)
                    row["ttfb_us"] = {"p50": pct(tt, 50), "p99": pct(tt, 99)}
                    if name != "direct" and direct:
                        k = min(len(s), len(direct))
                        diffs = sorted((s[i][0] - direct[i][0]) / 1000 for i in range(k))
                        row["added_ttfb_us_median"] = statistics.median(diffs)
                    timings = sorted(_server_timing_ms(x[3]) for x in s if x[3])
                    if timings:
                        row["dur_us"] = _dur_summary(timings)
                    row["cpu_us_per_req"] = (cpu1[name] - cpu0[name]) / 1000 / (n + warm)
                entry["rows"][name] = row
            self.results["stream"].append(entry)

    # ---------------------------------------------------------------- whole run
    def estimate(self, cases):
        """Seconds of measuring the plan should take (the run's time bound is 1.3× this)."""
        per = self.duration + 0.4
        extra = 1 if self.baseline_ref else 0
        runs = sum(self.rounds * (2 + extra + (1 if c.litellm else 0)
                                  + (3 if self.features and c.key in FEATURES_CASES else 0)
                                  + (len(self.stores) if c.key in FEATURES_CASES else 0)) + 1
                   for c in cases)
        c1 = 0.0
        if not self.args.no_c1 and not self.args.tls:
            # ~1.5 ms a request (the request and the idle wait after it), every gateway and direct
            n = (200 if self.quick else 1000) + 20
            c1 = sum(n * (3 + extra + (len(self.stores) if c.key in FEATURES_CASES else 0))
                     * 0.0015 for c in cases)
        scaling = 0
        if not self.args.no_scaling and not self.args.tls:
            sc = [k for i, e, sz in SCALING_CASES for k in ["%s-%s-%d" % (i, e, sz[1])]
                  if not self.args.only or any(o in k for o in self.args.only.split(","))]
            scaling = len(sc) * self.rounds * 2 * per + (6 if sc else 0)
        streams = (20 if self.quick else 40) * (1 + 0.3 * extra)
        return runs * per + c1 + scaling + 40 + streams

    def run(self):
        cases = plan_cases(self.quick)
        if self.args.only:
            cases = [c for c in cases if any(k in c.key for k in self.args.only.split(","))]
        self.features = self.features and any(c.key in FEATURES_CASES for c in cases)
        est = self.estimate(cases)
        self.bound = max(self.bound, est * 1.3)
        log("plan: %d cases, %d rounds, %d s per run; ~%.0f s of measuring (bound %.0f s)"
            % (len(cases), self.rounds, self.duration, est, self.bound))
        log("results: %s" % self.out_dir.relative_to(ROOT))
        ensure_taskset()
        ensure_wrk()
        if self.baseline_ref:
            try:
                self.baseline = baseline.prepare(self.baseline_ref, PY, self.log_dir,
                                                 self.args.baseline_build_timeout, log=log,
                                                 patch=self.args.baseline_patch)
            except baseline.BaselineError as e:
                raise SystemExit("bench: %s" % e) from None
        lite_why = "skipped (--no-litellm)" if self.args.no_litellm else \
            "skipped (--tls: LiteLLM is not given TLS)" if self.args.tls else ensure_litellm(
                str(self.log_dir), self.args.install_timeout)
        if lite_why:
            log("LiteLLM not measured: " + lite_why)
        self.setup_s = time.monotonic() - self.started_at
        self.started_at = time.monotonic()
        self.deadline = self.started_at + self.bound - (15 if self.quick else 30)
        self.start_all(lite_why)
        self.warmup()
        for case in cases:
            self.run_case(case)
        self.run_streams()
        self.run_scaling()
        self.fill_rss_after()
        self.sampler.stop()
        self.elapsed = time.monotonic() - self.started_at


def c1_row(s, direct, error):
    """One gateway's concurrency-1 summary from ttfb.measure samples (ttfb_ns, total_ns, status,
    server_timing, body head, kernel-stamped); `direct`: the direct samples of the same rounds
    (paired by index), None for the direct row itself."""
    row = {"samples": len(s), "kernel_stamped": sum(1 for x in s if x[5])}
    if error:
        row["error"] = error
    bad = [x for x in s if not 200 <= x[2] < 300]
    if bad:
        row["non2xx"] = len(bad)
        row["first_bad"] = "%d %s" % (bad[0][2], bad[0][4][:200].decode("utf-8", "replace"))
    if not s:
        return row
    lat = sorted(x[0] / 1000 for x in s)
    row["latency_us"] = {"p50": pct(lat, 50), "p99": pct(lat, 99) if len(lat) >= 100 else None}
    if direct:
        k = min(len(s), len(direct))
        diffs = sorted((s[i][0] - direct[i][0]) / 1000 for i in range(k))
        row["added_us"] = {"pairs": k, "median": statistics.median(diffs),
                           "p99": pct(diffs, 99) if k >= 100 else None}
    timings = sorted(_server_timing_ms(x[3]) for x in s if x[3])
    if timings:
        row["dur_us"] = _dur_summary(timings)
    return row


def _us(ms):
    return None if ms is None else ms * 1000.0


def _dur_summary(sorted_ms):
    """Server-Timing percentiles in µs; a tail percentile only when there are enough samples to
    have one (p99 from 100, p99.9 from 1000)."""
    if not sorted_ms:
        return None
    n = len(sorted_ms)
    return {"samples": n, "p50": _us(pct(sorted_ms, 50)),
            "p99": _us(pct(sorted_ms, 99)) if n >= 100 else None,
            "p999": _us(pct(sorted_ms, 99.9)) if n >= 1000 else None}


def _server_timing_ms(value: bytes):
    for part in value.decode("latin-1").split(","):
        part = part.strip()
        if part.startswith("busbar"):
            for p in part.split(";"):
                if p.strip().startswith("dur="):
                    return float(p.strip()[4:])
    return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs, LiteLLM only at ~1k tokens "
                    "(under ~3 minutes)")
    ap.add_argument("--duration", type=int, help="whole seconds per wrk run (default 5, quick 1)")
    ap.add_argument("--connections", type=int, default=32, help="wrk keep-alive connections")
    ap.add_argument("--no-litellm", action="store_true", help="do not install or run LiteLLM")
    ap.add_argument("--observe", choices=("off", "on", "access", "metrics"), default="off",
                    help="busbar's access log (to a file) and metrics: off (default), both on, or "
                    "only one of them")
    ap.add_argument("--tls", action="store_true",
                    help="busbar and the floor serve TLS (one self-signed ECDSA P-256 certificate, "
                    "TLS 1.3), wrk speaks HTTPS over its keep-alive connections; the direct row "
                    "stays plain HTTP; no stream rows, no LiteLLM")
    ap.add_argument("--keys", choices=("off",) + STORES + ("redis",), default="off",
                    help="busbar's virtual keys: off (default), or on with a governed group on a "
                    "SQLite store, a loopback redis-server (valkey; redis is the same) or a "
                    "loopback PostgreSQL, both started and stopped by the run")
    ap.add_argument("--stores", metavar="STORE[,STORE]",
                    help="one more busbar row per store (sqlite, valkey, postgres) on the small "
                    "same-protocol case, with virtual keys on that store and otherwise the busbar "
                    "row's config, interleaved with the others: keys off and on each store, one run")
    ap.add_argument("--only", help="comma-separated substrings of case keys to run "
                    "(e.g. openai-openai-4096)")
    ap.add_argument("--baseline", metavar="REF",
                    help="also run busbar as of git commit/branch REF (built once in "
                    "bench/.baseline/<sha>/) as the row busbar@<short sha>, interleaved with the "
                    "others, with its own ratio to the floor")
    ap.add_argument("--baseline-patch", metavar="FILE",
                    help="apply FILE (git apply) to --baseline's tree: a control that differs by one "
                    "change, e.g. bench/ab/no-breaker.patch (the breaker off the happy path)")
    ap.add_argument("--baseline-build-timeout", type=int, default=900,
                    help="bound on building the baseline's extensions (seconds)")
    ap.add_argument("--no-c1", action="store_true",
                    help="skip the concurrency-1 rows (added latency, Server-Timing at c=1)")
    ap.add_argument("--no-scaling", action="store_true",
                    help="skip the scaling rows (busbar --workers 1 and --workers 2)")
    ap.add_argument("--no-features", action="store_true",
                    help="skip the features rows (metrics + access log; keys on SQLite + both)")
    ap.add_argument("--install-timeout", type=int, default=420,
                    help="bound on installing LiteLLM the first time (seconds)")
    args = ap.parse_args(argv)
    if args.keys == "redis":
        args.keys = "valkey"            # the store module's name; redis kept as an alias
    bad = [x for x in (args.stores or "").split(",") if x and x not in STORES]
    if bad:
        ap.error("--stores: unknown store %s (known: %s)" % (", ".join(bad), ", ".join(STORES)))
    if args.baseline_patch and not args.baseline:
        ap.error("--baseline-patch needs --baseline REF (the tree it is applied to)")
    if sys.platform != "linux":
        sys.exit("bench: needs Linux (/proc, taskset)")
    # This script (the sampler, the TTFB client) stays off the gateway's core.
    bench = Bench(args)
    os.sched_setaffinity(0, {bench.load_core})

    def _stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    try:
        bench.run()
    except KeyboardInterrupt:
        log("interrupted: stopping every process this run started")
        raise SystemExit(130) from None
    finally:
        # Processes first: nothing below may keep a started process alive.
        bench.procs.stop_all()
        bench.stop_stores()
        if bench.sampler.is_alive():
            bench.sampler.stop()
    # A gateway that logged tracebacks or errors during the run says so under the table.
    for st in bench.procs.history:
        try:
            text = pathlib.Path(st.log_path).read_text(errors="replace")
        except OSError:
            continue
        n = text.count("Traceback (most recent call last)") + text.count(" ERROR ")
        if n:
            bench.results["notes"].append("%s logged %d traceback(s)/error(s) during the run: see %s"
                                          % (st.name, n, pathlib.Path(st.log_path).relative_to(ROOT)))
    labels = {n: n for n in bench.targets}
    labels["direct"] = "direct (mock)"
    if FEATURES in bench.targets:
        labels[FEATURES] = FEATURES_LABEL
    if OBSERVE in bench.targets:
        labels[OBSERVE] = OBSERVE_LABEL
    if HOOK in bench.targets:
        labels[HOOK] = HOOK_LABEL
    for st in bench.stores:
        labels[store_row(st)] = store_label(st)
    meta = {"commit": procs.git_head(), "cpu": procs.cpu_model(), "cores": os.cpu_count(),
            "command": shlex.join(getattr(sys, "orig_argv", [PY] + sys.argv)),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "duration_s": bench.duration, "rounds": bench.rounds, "connections": bench.conns,
            "gateway_core": bench.gw_core, "load_core": bench.load_core,
            "all_cores": bench.all_cores,
            "setup_s": round(bench.setup_s, 1), "elapsed_s": round(bench.elapsed, 1),
            "rss_idle_kib": {n: t.rss_idle for n, t in bench.targets.items()},
            "pss_idle_kib": {n: t.pss_idle for n, t in bench.targets.items()},
            "labels": labels,
            "baseline": bench.baseline.meta() if bench.baseline else None,
            "options": {k: v for k, v in vars(bench.args).items()},
            "not_measured": {n: t.failed for n, t in bench.targets.items() if t.failed}}
    results = dict(meta=meta, **bench.results)
    (bench.out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    table = report.render(results)
    (bench.out_dir / "table.md").write_text(table)
    print(table, end="")
    log("wrote %s and results.json (%.0f s measuring, %.0f s setup)"
        % ((bench.out_dir / "table.md").relative_to(ROOT), bench.elapsed, bench.setup_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
