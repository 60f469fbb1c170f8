"""The Rust gateway's 1.5.3 grammar, read as busbar's own (issue #36): identity providers and the
admin chain, the key chain, role bindings and key lifetimes, `store: {module, settings}`, `*_utok`
rates, budgets in cents, the pool keys (section-wide hooks and credentials, strategies, affinity,
tiers, tags), `max_requests: -1`, the Rust names of three limits, `plugins`, `routing`,
`per_request_fee` and the `advanced` tuning keys. Each rule with its message; the Rust project's
own configs where its mirror is on this machine; and the admin token and key lifetime through the
real server."""
from __future__ import annotations

import json
import pathlib
import subprocess
import textwrap
import urllib.error
import urllib.request

import pytest

from busbar.config import ConfigError, load
from busbar.governance.model import NANO_PER_CENT
from tests.conftest import PY, ROOT, env, free_port, start_gateway, stop

ENV = {"ANTHROPIC_KEY": "sk-ant-SECRET", "ADMIN_TOKEN": "admin-SECRET-token",
       "VIEW_TOKEN": "view-SECRET-token", "SIGNING": "ab" * 32}
BASE = """
providers:
  anthropic: {api_key: {env: ANTHROPIC_KEY}}
models:
  claude: {provider: anthropic}
"""


def cfg(text, env=None):
    return load(text=BASE + textwrap.dedent(text), env=ENV if env is None else env)


def problems(text, env=None):
    with pytest.raises(ConfigError) as info:
        cfg(text, env)
    return info.value.problems


# --- identity providers and the admin chain ---------------------------------------------------

def test_admin_tokens_provider_is_the_operator_credential():
    c = cfg("""
        identity-providers:
          admin-tokens: {module: admin-tokens, token: {env: ADMIN_TOKEN}}
          viewer: {module: admin-tokens, token: {env: VIEW_TOKEN}, max_admin_scope: read-only}
        auth:
          chain: []
          admin_auth: [admin-tokens, viewer]
    """)
    tokens = {t.name: (t.token, t.scope) for t in c.control.admin_tokens}
    assert tokens == {"admin-tokens": ("admin-SECRET-token", "full"),
                      "viewer": ("view-SECRET-token", "read-only")}
    assert not c.control.admin_open
    assert "SECRET" not in repr(c.control)


def test_admin_auth_defaults_to_admin_tokens_and_empty_is_open():
    c = cfg("identity-providers:\n  admin-tokens: {module: admin-tokens, token: {env: ADMIN_TOKEN}}\n")
    assert [t.name for t in c.control.admin_tokens] == ["admin-tokens"]
    c = cfg("auth: {admin_auth: []}\n")
    assert c.control.admin_open and c.control.admin_tokens == ()
    assert any(w.startswith("auth.admin_auth: []: the admin API is open") for w in c.warnings)
    # a bare built-in with no definition holds no token: no admin credential at all
    assert cfg("auth: {admin_auth: [admin-tokens]}\n").control.admin_tokens == ()


def test_identity_provider_refusals():
    errs = problems("""
        identity-providers:
          gh: {module: github-oauth, settings: {org: acme}}
          k: {module: keys, token: {env: ADMIN_TOKEN}}
          nomod: {settings: {}}
          b: {module: admin-tokens, token: {env: ADMIN_TOKEN}, browser_login: {client_id: x}}
          s: {module: admin-tokens, max_admin_scope: mint}
        auth:
          admin_auth: [missing, 7]
    """)
    assert errs == [
        "identity-providers.gh.module: identity-provider module 'github-oauth' is not built into "
        "busbar (built in: keys, admin-tokens); busbar loads no plugins",
        "identity-providers.k.token: only a module: admin-tokens provider holds a token",
        "identity-providers.nomod: missing required key 'module'",
        "identity-providers.b.browser_login: module 'admin-tokens' has no browser login",
        "identity-providers.s.max_admin_scope: expected one of full, read-only",
        "auth.admin_auth[0]: 'missing' is not defined under identity-providers (built in: keys, "
        "admin-tokens)",
        "auth.admin_auth[1]: expected the bare name of an identity provider, got an integer",
    ]
    errs = problems("""
        identity-providers:
          admin-tokens: {module: admin-tokens, token: {env: EMPTY}}
    """, dict(ENV, EMPTY=""))
    assert "identity-providers.admin-tokens.token: resolves to an empty token" in errs


def test_the_key_chain_by_bare_name_or_a_keys_provider():
    c = cfg("auth: {chain: [keys], signing_key: {env: SIGNING}}\n")
    assert c.governance.keys
    c = cfg("""
        identity-providers:
          vk: {module: keys}
        auth: {chain: [vk], signing_key: {env: SIGNING}}
    """)
    assert c.governance.keys
    errs = problems("""
        identity-providers:
          admin-tokens: {module: admin-tokens, token: {env: ADMIN_TOKEN}}
        auth: {chain: [admin-tokens, nope]}
    """)
    assert errs[:2] == [
        "auth.chain[0]: 'admin-tokens' (module admin-tokens) guards the admin API; it belongs in "
        "auth.admin_auth",
        "auth.chain[1]: unknown identity provider 'nope' (built in: keys; or a name under "
        "identity-providers)",
    ]


def test_role_bindings_and_key_ttl():
    c = cfg("auth: {chain: [keys], signing_key: {env: SIGNING}, role_bindings: {}, key_ttl: 12h}\n")
    assert c.governance.key_ttl_secs == 12 * 3600
    assert cfg("auth: {chain: [keys], signing_key: {env: SIGNING}}\n").governance.key_ttl_secs \
        == 90 * 86400
    errs = problems("auth: {chain: [keys], signing_key: {env: SIGNING}, key_ttl: 90, "
                    "role_bindings: {sso: {dev: {group: g}}}}\n")
    assert errs == [
        "auth.role_bindings.sso: busbar's identity providers (keys, admin-tokens) assert no roles; "
        "role bindings need a provider module busbar does not have",
        "auth.key_ttl: expected a duration like 90d, 12h, 30m or 3600s, got an integer",
    ]
    assert problems("auth: {key_ttl: 4000d}\n") == ["auth.key_ttl: at most ten years"]


# --- governance in the Rust units ---------------------------------------------------------------

def test_store_module_forms():
    c = cfg("store: {module: sqlite, settings: {db_path: /tmp/x.db, busy_timeout_ms: 100}}\n")
    assert (c.governance.store.kind, c.governance.store.path) == ("sqlite", "/tmp/x.db")
    c = cfg("store: {module: busbar-store-valkey-plugin, settings: {url: 'redis://127.0.0.1:6379/0'}}\n")
    assert (c.governance.store.kind, c.governance.store.url) == ("redis", "redis://127.0.0.1:6379/0")
    assert cfg("store: {module: memory}\n").governance.store.kind == "memory"
    c = cfg("store: {module: sqlite}\nadvanced: {usage_flush_interval_ms: 100}\n")
    assert c.governance.store.flush_secs == 0.1
    for module, msg in (
            ("postgres", "store.settings.url: expected a postgres:// or postgresql:// URL"),
            ("s3", "store.module: store module 's3' is not built into busbar (built in: memory, "
                   "sqlite, valkey, postgres); busbar loads no plugins")):
        assert problems("store: {module: %s, settings: {url: 'redis://h:1'}}\n" % module) == [msg]
    for module in ("postgres", "busbar-store-postgres", "busbar-store-postgres-plugin"):
        c = cfg("store: {module: %s, settings: {url: 'postgres://busbar@10.0.0.5:5432/gov', "
                "pool_size: 8, timeout_ms: 1500}}\n" % module)
        sc = c.governance.store
        assert (sc.kind, sc.url, sc.pool_size, sc.socket_timeout_secs) == (
            "postgres", "postgres://busbar@10.0.0.5:5432/gov", 8, 1.5)
    assert cfg("store: {module: postgres, settings: {url: 'postgresql://h/db'}}\n"
               ).governance.store.pool_size == 4
    # a password is a secret: never inline, never quoted back
    for url in ("postgres://busbar:hunter2@h/db", "postgres://h/db?password=hunter2"):
        errs = problems("store: {module: postgres, settings: {url: '%s'}}\n" % url)
        assert errs == ["store.settings.url: this URL carries a password, and inline secrets are "
                        "not allowed; put the whole URL in a reference, e.g. url: {env: "
                        "BUSBAR_POSTGRES_URL}"] and "hunter2" not in errs[0]
    assert problems("store: {module: postgres, settings: {url: 'postgres://h/db', pool_size: 0, "
                    "timeout_ms: 1}}\n") == [
        "store.settings.timeout_ms: expected an integer between 10 and 60000",
        "store.settings.pool_size: expected an integer between 1 and 64"]
    assert problems("store: {module: postgres}\n") == [
        "store.settings: module postgres needs url (postgres://user@host:5432/db)"]
    assert problems("store: {module: valkey, settings: {}}\n") == [
        "store.settings: module valkey needs url (redis:// or rediss://)"]


def test_rates_in_micro_units_per_token():
    a = cfg("rate_card:\n  claude: {input_utok: 3.0, output_utok: 15.0, cache_read_utok: 0.3}\n")
    assert a.governance.rate_card["claude"].nano(1_000_000, 0) == 3 * 10 ** 9   # 3 units / Mtok
    assert cfg("rate_card:\n  claude: {}\n").governance.rate_card is not None  # utok: all default 0
    assert problems("rate_card:\n  claude: {input_utok: -1, outptu_utok: 2}\n")[:2] == [
        "rate_card.claude.outptu_utok: unknown key (did you mean 'output_utok'?)",
        "rate_card.claude.input_utok: expected a finite non-negative number (micro-units per token)",
    ]


def test_budgets_in_cents_and_child_default():
    c = cfg("""
        groups:
          org:
            limits: [{budget: 1000000, per: month, on_exhaust: block}, {requests: 5, per: minute}]
            child_default: {limits: [{budget: 2000, per: month}]}
    """)
    lim = c.governance.groups["org"].limits[0]
    assert lim.amount == 1_000_000 * NANO_PER_CENT and lim.public() == {"budget": 1000000,
                                                                         "per": "month"}
    errs = problems("""
        groups:
          g:
            limits:
              - {budget: 0, per: day}
              - {budget: 5, per: day, pool: p, on_exhaust: downgrade, downgrade_to: q}
              - {budget: 5, per: day, downgrade_to: q}
              - {requests: 5, per: day, on_exhaust: block}
            child_default: {limits: [{budget: 1.5, per: day}], extra: 1}
    """)
    assert errs == [
        "groups.g.child_default.extra: unknown key",
        "groups.g.child_default.limits[0].budget: expected a positive integer (cents)",
        "groups.g.limits[0].budget: expected a positive integer (cents)",
        "groups.g.limits[1].pool: unknown pool or model 'p'",
        "groups.g.limits[1].downgrade_to: unknown pool 'q'",
        "groups.g.limits[2].downgrade_to: needs on_exhaust: downgrade",
        "groups.g.limits[3].on_exhaust: only a budget has one",
    ]


def test_per_request_fee_plugins_routing_advanced():
    c = cfg("""
        per_request_fee: 0
        plugins: {enabled: true, dir: plugins, trust: {publishers: []}, min_versions: {},
                  fetch: [{url: "https://example.org/p.tar.gz"}]}
        routing: {default_policy_timeout_ms: 5}
        advanced: {rate_sweep_interval: 256, upstream_http1_only: true}
    """)
    assert any(w.startswith("plugins.enabled: busbar loads no plugins") for w in c.warnings)
    assert any(w.startswith("plugins.fetch: busbar fetches no plugins") for w in c.warnings)
    c = cfg("per_request_fee: 2\ngroups: {g: {limits: [{budget: 10, per: day}]}}\n")
    assert c.governance.fee == 2 * 10_000_000       # cents as nano-units
    errs = problems("""
        per_request_fee: -2
        routing: {default_policy_timeout_ms: 0}
        advanced: {upstream_h2_prior_knowledge: true}
    """)
    assert errs == [
        "advanced.upstream_h2_prior_knowledge: busbar speaks HTTP/1.1 to upstreams; HTTP/2 is not "
        "supported by this busbar version",
        "routing.default_policy_timeout_ms: must be >= 1, got 0",
        "per_request_fee: expected a non-negative integer (cents of the rate card's unit, charged "
        "per request to every budget), got -2",
    ]


# --- models, pools, limits ---------------------------------------------------------------------

def test_max_requests_negative_is_unlimited_and_zero_is_refused():
    c = load(text=BASE.replace("{provider: anthropic}", "{provider: anthropic, max_requests: -1}"),
             env=ENV)
    assert c.models["claude"].max_requests is None
    with pytest.raises(ConfigError) as info:
        load(text=BASE.replace("{provider: anthropic}", "{provider: anthropic, max_requests: 0}"),
             env=ENV)
    assert info.value.problems == ["models.claude.max_requests: 0 would refuse every request; a "
                                   "negative value (the default, -1) means unlimited"]


def test_pool_keys_of_the_rust_grammar():
    c = cfg("""
        pools:
          upstream_credentials: own
          hooks: [weighted]
          p:
            hooks: [cheapest]
            affinity: {mode: session}
            members:
              - {model: claude, tier: primary, tags: [a, b]}
    """)
    p = c.pools["p"]
    assert (p.strategy, p.hooks, p.affinity_header, p.upstream_credentials) == (
        "cheapest", ("weighted", "cheapest"), "x-session-id", "own")
    assert (p.members[0].tier, p.members[0].tags) == ("primary", ("a", "b"))
    # Strategies, affinity and tiers are applied (busbar/routing/plan.py): nothing to warn about.
    assert not [w for w in c.warnings if w.startswith("pools.p")]
    errs = problems("""
        pools:
          upstream_credentials: sometimes
          p:
            members: [{model: claude, tier: 3, tags: x}]
    """)
    assert errs == [
        "pools.upstream_credentials: expected one of own, passthrough, got a string",
        "pools.p.members[0].tier: expected a string or null, got an integer",
        "pools.p.members[0].tags: expected a list of strings, got a string",
    ]
    errs = problems("""
        pools:
          p:
            hooks: [cheapest, fastest, my-hook, 7]
            affinity: {mode: sticky}
            upstream_credentials: passthrough
            members: [{model: claude}]
    """)
    for want in ("pools.p.hooks[2]: unknown hook 'my-hook'; define it under the top-level hooks:",
                 "pools.p.hooks: at most one ordering strategy per pool",
                 "pools.p.affinity.mode: expected session"):
        assert want in errs
    assert not [e for e in errs if "upstream_credentials" in e]
    c = cfg("""
        pools:
          upstream_credentials: passthrough
          p: {members: [{model: claude}]}
          q: {upstream_credentials: own, members: [{model: claude}]}
    """)
    assert c.upstream_credentials == "passthrough"
    assert (c.pools["p"].upstream_credentials, c.pools["q"].upstream_credentials) == (
        "passthrough", "own")


def test_limits_by_their_rust_names():
    c = cfg("limits: {pool_max_idle_per_host: 1024, pool_idle_timeout_secs: 300, "
            "upstream_error_body_max_bytes: 4096, reasoning_effort_budgets: {low: 4096}}\n")
    lim = c.limits
    assert (lim.pool_max_idle_per_host, lim.pool_idle_timeout_secs,
            lim.upstream_error_body_max_bytes) == (1024, 300, 4096)
    assert lim.reasoning_effort_budgets == (1024, 4096, 8192, 16384)
    c = cfg("limits: {reasoning_effort_budgets: {low: 5000}}\n")
    assert c.limits.reasoning_effort_budgets == (1024, 5000, 8192, 16384)
    errs = problems("limits: {reasoning_effort_budgets: {low: 0}}\n")
    assert errs == ["limits.reasoning_effort_budgets.low: expected a positive integer, got an "
                    "integer"]


# --- the Rust project's own configs -------------------------------------------------------------

MIRROR = pathlib.Path("/work/.mirror/GetBusbar+busbar/repo")


def _rust_file(path):
    """A file of the Rust project at v1.5.5, read from its mirror (never committed here)."""
    if not MIRROR.exists():
        pytest.skip("the GetBusbar/busbar mirror is not on this machine")
    p = subprocess.run(["git", "-C", str(MIRROR), "show", "HEAD:" + path], capture_output=True,
                       text=True, timeout=30)
    if p.returncode != 0:
        pytest.skip("%s is not in the mirror" % path)
    return p.stdout


def test_the_rust_images_default_config_validates_as_it_is(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(_rust_file("docker/config.yaml"))
    e = env()
    e.update(ANTHROPIC_KEY="sk-ant-x", BUSBAR_ADMIN_TOKEN="t" * 32)
    r = subprocess.run([PY, "-m", "busbar.cli", "validate", "--config", str(p)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: config valid — 1 provider(s), 1 model(s), 1 pool(s)")


# --- through the real server --------------------------------------------------------------------

def _admin(port, path, token=None, body=None):
    req = urllib.request.Request("http://127.0.0.1:%d/api/v1/admin/%s" % (port, path),
                                 data=None if body is None else json.dumps(body).encode(),
                                 method="POST" if body is not None else "GET")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_admin_token_and_key_ttl_through_the_server(tmp_path, mock_port):
    admin = free_port()
    gw = start_gateway(tmp_path, f"""
listen: "127.0.0.1:{{port}}"
admin_listen: "127.0.0.1:{admin}"
identity-providers:
  admin-tokens: {{module: admin-tokens, token: {{env: ADMIN_TOKEN}}}}
  viewer: {{module: admin-tokens, token: {{env: VIEW_TOKEN}}, max_admin_scope: read-only}}
auth:
  chain: [keys]
  admin_auth: [admin-tokens, viewer]
  signing_key: {{env: SIGNING}}
  key_ttl: 2d
store: {{module: memory}}
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {{env: MOCK_KEY}}}}
models:
  gpt: {{provider: m, upstream_model: gpt-4o-mini}}
""", extra_env={k: ENV[k] for k in ("ADMIN_TOKEN", "VIEW_TOKEN", "SIGNING")})
    try:
        assert _admin(admin, "info")[0] == 401
        assert _admin(admin, "info", "wrong-token")[0] == 401
        assert _admin(admin, "info", ENV["VIEW_TOKEN"])[0] == 200
        assert _admin(admin, "keys", ENV["VIEW_TOKEN"], {"name": "a"})[0] == 403
        status, key = _admin(admin, "keys", ENV["ADMIN_TOKEN"], {"name": "a"})
        assert status == 201, key
        # epoch seconds, as the Rust gateway answers them
        assert abs((key["expires_at"] - key["created_at"]) - 2 * 86400) < 60, key
    finally:
        stop(gw.proc)


# --- export, public_url ------------------------------------------------------------------------

def test_export_instances_are_busbars_observability():
    c = cfg("""
        export:
          metrics: {module: prometheus, settings: {buffer_seconds: 60, key_gauge_limit: 500}}
          traces: {module: otlp, settings: {url: "http://127.0.0.1:4318/v1/traces"}}
          hook:
            module: request-log-webhook
            settings: {url: "https://logs.example.org/in", auth_header: {name: Authorization,
                       value: "Bearer abc"}, max_inflight_deliveries: 8, delivery_timeout_secs: 3}
          file: {module: request-log-file, settings: {path: /tmp/r.jsonl, rotate_mb: 5},
                 fields: [time, pool, outcome]}
          access: {module: access-log, settings: {path: "off"}}
    """)
    o = c.observability
    assert o.metrics and o.access_log == "off" and o.otlp.url == "http://127.0.0.1:4318/v1/traces"
    hook, file = o.request_logs
    assert (hook.url, hook.auth_header, hook.max_inflight, hook.timeout_ms) == (
        "https://logs.example.org/in", "Bearer abc", 8, 3000)
    assert (file.path, file.rotate_mb, file.fields) == ("/tmp/r.jsonl", 5, ("time", "pool", "outcome"))
    # no export: nothing exported but busbar's access log
    o = cfg("export: {}\n").observability
    assert (o.metrics, o.request_logs, o.otlp, o.access_log) == (False, (), None, "stderr")


def test_export_refusals():
    errs = problems("""
        export:
          a: {module: prometheus, settings: {}}
          b: {module: prometheus, settings: {buffer_seconds: 1}}
          c: {module: statsd}
          d: {module: request-log-webhook, settings: {url: "https://x.example.org", auth_header: "tok"}}
          e: {module: request-log-file, settings: {path: /tmp/x}, durable: true, streams: [audit]}
    """)
    assert errs == [
        "export.a.settings: missing required key 'buffer_seconds'",
        "export.b: at most one prometheus instance (export.a is one)",
        "export.c.module: expected one of prometheus, otlp, request-log-webhook, request-log-file, "
        "access-log",
        "export.d.settings.auth_header: expected {name, value}: the header to send (the value may "
        "use ${VAR})",
        "export.e.durable: durable delivery is not implemented",
        "export.e.streams[0]: expected one of metrics, logs, traces, costs, decisions, events, "
        "identity, prompts, completions",
    ]


@pytest.mark.parametrize("url, error", [
    ("https://llm.example.com", None),
    ("http://127.0.0.1:8080/", None),
    ("http://llm.example.com", "public_url: http:// is allowed only for loopback and private hosts; "
                               "use https://"),
    ("https://llm.example.com/v1", "public_url: expected an absolute http(s)://host[:port] with "
                                   "nothing after it"),
])
def test_public_url(url, error):
    if error is None:
        cfg("public_url: %s\n" % url)
    else:
        assert problems("public_url: %s\n" % url) == [error]


# --- secret references in their canonical form -----------------------------------------------

def test_canonical_secret_references_mean_the_sugar():
    a = cfg("identity-providers:\n  admin-tokens: {module: admin-tokens, token: "
            "{module: env, settings: {key: ADMIN_TOKEN}}}\n")
    assert a.control.admin_tokens[0].token == ENV["ADMIN_TOKEN"]
    c = load(text=BASE.replace("{env: ANTHROPIC_KEY}", "{module: env, settings: {key: ANTHROPIC_KEY}}"),
             env=ENV)
    assert c.providers["anthropic"].api_key == ENV["ANTHROPIC_KEY"]
    errs = problems("""
        secrets: {vault: {settings: {addr: x}}, env: {settings: {}}}
        identity-providers:
          a: {module: admin-tokens, token: {module: vault, settings: {path: x}}}
          b: {module: admin-tokens, token: {module: env, settings: {path: X}}}
          c: {module: admin-tokens, token: {module: env, env: X}}
        auth: {admin_auth: [a, b, c]}
    """)
    assert errs == [
        "secrets.vault: secret module 'vault' is not built into busbar (built in: env, file); "
        "busbar loads no plugins",
        "secrets.env: the built-in env and file modules take no settings",
        "identity-providers.a.token.module: secret module 'vault' is not built into busbar "
        "(built in: env, file); busbar loads no plugins",
        "identity-providers.b.token.settings: module env takes settings: {key: ...}",
        "identity-providers.c.token: a reference with module: takes only module and settings "
        "(not env)",
    ]


def test_admin_insecure_names_its_new_home():
    assert problems("admin_insecure: true\n") == [
        "admin_insecure: retired; write admin_require_mtls (the opposite value) instead "
        "(`busbar --migrate-config FILE` converts the file)"]


def test_the_configuration_docs_rust_grammar_example_loads():
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text[text.index("## The Rust gateway's grammar"):]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    example = example.replace("{file: /run/secrets/busbar-signing.key}", "{env: SIGNING}")
    c = load(text=example, env=dict(ENV, BUSBAR_ADMIN_TOKEN="t" * 32))
    assert c.governance.keys and {t.name for t in c.control.admin_tokens} == {"admin-tokens", "viewer"}
    assert c.observability.metrics and c.observability.otlp is not None
