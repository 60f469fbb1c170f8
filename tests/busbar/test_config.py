"""busbar.config: loading, every refusal with its message shape, secret hygiene, validate, catalog."""
from __future__ import annotations

import os
import textwrap

import pytest

from busbar import config
from busbar.config import ConfigError, Limits, load, validate_main
from busbar.config.checks import Problems

SECRET = "sk-ant-api03-SECRETVALUE-0123456789"
ENV = {"ANTHROPIC_KEY": SECRET, "OPENAI_KEY": "sk-openai-SECRET2", "GROQ_KEY": "gsk_SECRET3"}


def cfg(text: str, env: dict | None = None) -> config.Config:
    return load(text=textwrap.dedent(text), env=ENV if env is None else env)


def problems(text: str, env: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        cfg(text, env)
    err = info.value
    assert str(err) == "\n".join(err.problems)
    return err.problems


MINIMAL = """
providers:
  anthropic: {api_key: {env: ANTHROPIC_KEY}}
models:
  claude: {provider: anthropic}
"""


# --- loading good configs ---------------------------------------------------------------------


def test_catalog_provider_needs_only_api_key():
    c = cfg(MINIMAL)
    p = c.providers["anthropic"]
    assert (p.name, p.protocol, p.base_url) == ("anthropic", "anthropic", "https://api.anthropic.com")
    assert (p.scheme, p.host, p.port, p.path_prefix) == ("https", "api.anthropic.com", 443, "")
    assert p.api_key == SECRET
    assert p.auth == "x-api-key"
    assert p.region is None and p.headers == ()
    m = c.models["claude"]
    assert m.provider is p
    assert m.upstream_model == "claude"  # defaults to the key
    assert (m.max_concurrent, m.default_max_tokens, m.reasoning, m.attempt_timeout_ms) == (None, None, False, None)
    assert (c.listen_host, c.listen_port, c.workers, c.server_timing) == ("0.0.0.0", 8080, None, False)
    assert c.pools == {} and c.limits == Limits() and c.source == "<embedded>" and c.warnings == ()


def test_default_auth_per_protocol():
    c = cfg("""
        providers:
          openai: {api_key: {env: OPENAI_KEY}}
          openai-responses: {api_key: {env: OPENAI_KEY}}
          gemini: {api_key: {env: OPENAI_KEY}}
          cohere: {api_key: {env: OPENAI_KEY}}
          anthropic: {api_key: {env: ANTHROPIC_KEY}}
          bedrock: {api_key: {env: AWS}}
        models: {}
    """, {**ENV, "AWS": "AKIAEXAMPLE:secretkey"})
    auth = {name: (p.protocol, p.auth) for name, p in c.providers.items()}
    assert auth == {
        "openai": ("openai", "bearer"),
        "openai-responses": ("responses", "bearer"),
        "gemini": ("gemini", "x-goog-api-key"),
        "cohere": ("cohere", "bearer"),
        "anthropic": ("anthropic", "x-api-key"),
        "bedrock": ("bedrock", "sigv4"),
    }
    assert c.providers["bedrock"].region == "us-east-1"
    assert c.providers["gemini"].base_url == "https://generativelanguage.googleapis.com"


def test_custom_provider_url_parts_and_trailing_slash():
    c = cfg("""
        providers:
          mine:
            protocol: openai
            base_url: https://LLM.Example.com:8443/proxy/openai//
            api_key: {env: OPENAI_KEY}
            headers: {HTTP-Referer: https://app.example.com, X-Title: demo}
        models:
          m: {provider: mine, upstream_model: org/model-7b, max_concurrent: 3,
              default_max_tokens: 512, reasoning: true, attempt_timeout_ms: 2500}
    """)
    p = c.providers["mine"]
    assert p.base_url == "https://llm.example.com:8443/proxy/openai"
    assert (p.scheme, p.host, p.port, p.path_prefix) == ("https", "llm.example.com", 8443, "/proxy/openai")
    assert p.auth == "bearer"
    assert p.headers == (("HTTP-Referer", "https://app.example.com"), ("X-Title", "demo"))
    m = c.models["m"]
    assert (m.upstream_model, m.max_concurrent, m.default_max_tokens, m.reasoning, m.attempt_timeout_ms) == (
        "org/model-7b", 3, 512, True, 2500)


def test_catalog_alias_and_overrides():
    c = cfg("""
        providers:
          work-openai: {catalog: openai, api_key: {env: OPENAI_KEY}}
          groq: {api_key: {env: GROQ_KEY}, base_url: "https://eu.api.groq.com/openai/"}
          claude-proxy: {catalog: anthropic, api_key: {env: ANTHROPIC_KEY}, auth: bearer}
        models: {}
    """)
    assert c.providers["work-openai"].protocol == "openai"
    assert c.providers["work-openai"].base_url == "https://api.openai.com"
    assert c.providers["groq"].base_url == "https://eu.api.groq.com/openai"
    assert c.providers["groq"].path_prefix == "/openai"
    assert c.providers["claude-proxy"].auth == "bearer"


def test_keyless_local_providers():
    c = cfg("""
        providers:
          ollama:
          vllm: {}
          lan: {protocol: openai, base_url: "http://10.1.2.3:8000"}
          v6: {protocol: openai, base_url: "http://[::1]:9000/"}
          named: {protocol: anthropic, base_url: "http://localhost:4010"}
        models: {}
    """)
    for name in ("ollama", "vllm", "lan", "v6", "named"):
        assert c.providers[name].api_key is None
        assert c.providers[name].auth == "none"
    assert (c.providers["ollama"].host, c.providers["ollama"].port) == ("127.0.0.1", 11434)
    assert (c.providers["v6"].host, c.providers["v6"].port, c.providers["v6"].base_url) == ("::1", 9000, "http://[::1]:9000")


def test_file_secret_relative_to_config_dir_and_trailing_newline(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "anthropic").write_text(SECRET + "\n")
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent("""
        providers:
          anthropic: {api_key: {file: keys/anthropic}}
        models:
          claude: {provider: anthropic}
    """))
    c = load(str(path), env={})
    assert c.providers["anthropic"].api_key == SECRET
    assert c.source == str(path)


def test_config_path_from_env_and_default(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.yaml"
    path.write_text(MINIMAL)
    assert load(env={**ENV, "BUSBAR_CONFIG": str(path)}).source == str(path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(MINIMAL)
    assert load(env=ENV).source == "config.yaml"


def test_bedrock_region_and_key_shape():
    env = {"AWS": "AKIAEXAMPLE:secret:session-token"}
    c = cfg("""
        providers:
          west: {catalog: bedrock, base_url: "https://bedrock-runtime.us-west-2.amazonaws.com", api_key: {env: AWS}}
          vpce: {protocol: bedrock, base_url: "https://vpce-1.bedrock-runtime.eu-west-1.vpce.amazonaws.com",
                 region: eu-west-1, api_key: {env: AWS}}
        models: {}
    """, env)
    assert c.providers["west"].region == "us-west-2"
    assert c.providers["vpce"].region == "eu-west-1"
    # region alone on a catalog entry moves the catalog's host to that region (issue 9)
    c = cfg("providers:\n  bedrock: {api_key: {env: AWS}, region: eu-west-1}\nmodels: {}\n", env)
    assert c.providers["bedrock"].host == "bedrock-runtime.eu-west-1.amazonaws.com"
    errs = problems("""
        providers:
          a: {catalog: bedrock, base_url: "https://bedrock-runtime.us-east-1.amazonaws.com", region: eu-west-1,
              api_key: {env: AWS}}
          b: {protocol: bedrock, base_url: "https://bedrock.example.com", api_key: {env: AWS}}
          c: {catalog: bedrock, api_key: {env: BAD}}
          d: {catalog: openai, region: us-east-1, api_key: {env: AWS}}
          e: {catalog: openai, auth: sigv4, api_key: {env: AWS}}
        models: {}
    """, {**env, "BAD": "just-one-part"})
    assert "providers.a.region: 'eu-west-1' does not match the base_url host's region 'us-east-1'" in errs
    assert "providers.b: cannot derive the AWS region from base_url; set region:" in errs
    assert "providers.c.api_key: a sigv4 key is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]" in errs
    assert "providers.d.region: region applies only to protocol bedrock" in errs
    assert "providers.e.auth: sigv4 signing is only for protocol bedrock" in errs
    assert not any("just-one-part" in e for e in errs)


def test_pools_members_weights_and_reasoning_override():
    c = cfg("""
        providers:
          anthropic: {api_key: {env: ANTHROPIC_KEY}}
          openai: {api_key: {env: OPENAI_KEY}}
        models:
          claude: {provider: anthropic, reasoning: true}
          gpt: {provider: openai}
        pools:
          mixed:
            members:
              - {model: claude, weight: 5, reasoning: false}
              - {model: gpt}
    """)
    pool = c.pools["mixed"]
    assert pool.name == "mixed"
    assert [(m.model.name, m.weight, m.reasoning) for m in pool.members] == [("claude", 5, False), ("gpt", 1, None)]
    assert pool.members[0].model is c.models["claude"]
    assert c.warnings == (
        "pools.mixed: members speak different protocols (anthropic, openai); requests are translated per lane",
    )


def test_limits_listen_advanced():
    c = cfg(MINIMAL + """
listen: "[::1]:9000"
limits:
  request_body_max_bytes: 1048576
  idle_timeout_secs: 5
  upstream_request_timeout_secs: 12.5
  max_inbound_concurrent: 0
advanced:
  worker_threads: 3
  response_headers: {server_timing: true}
""")
    assert (c.listen_host, c.listen_port) == ("::1", 9000)
    assert c.limits.request_body_max_bytes == 1048576
    assert c.limits.idle_timeout_secs == 5.0 and isinstance(c.limits.idle_timeout_secs, float)
    assert c.limits.upstream_request_timeout_secs == 12.5
    assert c.limits.max_inbound_concurrent == 0
    assert c.limits.header_max_bytes == 64 * 1024  # untouched default
    assert (c.workers, c.server_timing) == (3, True)
    assert (cfg(MINIMAL + 'listen: "127.0.0.1:0"\n').listen_port) == 0
    assert cfg(MINIMAL + 'listen: ":7000"\n').listen_host == "0.0.0.0"


def test_limits_defaults():
    d = Limits()
    assert d.request_body_max_bytes == 32 * 1024 * 1024
    assert d.upstream_error_body_max_bytes == 256 * 1024
    assert (d.header_max_bytes, d.header_count_max) == (65536, 100)
    assert (d.header_read_timeout_secs, d.idle_timeout_secs, d.drain_timeout_secs) == (30, 75, 30)
    assert (d.upstream_connect_timeout_secs, d.upstream_request_timeout_secs) == (10, 300)
    assert (d.pool_max_idle_per_host, d.pool_idle_timeout_secs) == (64, 90)
    assert (d.max_inbound_concurrent, d.default_max_tokens) == (8192, 4096)


# --- interpolation ----------------------------------------------------------------------------


def test_interpolation_fills_values_everywhere():
    c = cfg("""
        # comments are interpolated too: ${PORT}
        listen: "127.0.0.1:${PORT}"
        providers:
          mine: {protocol: openai, base_url: "https://${HOST}/v1", api_key: {env: KEY}}
        models:
          ${NAME}: {provider: mine, max_concurrent: ${N}}
    """, {"PORT": "9999", "HOST": "llm.internal.example", "KEY": "k", "NAME": "my-model", "N": "7"})
    assert c.listen_port == 9999
    assert c.providers["mine"].host == "llm.internal.example"
    assert c.models["my-model"].max_concurrent == 7


def test_interpolation_errors_name_the_variable():
    errs = problems("""
        # ${IN_COMMENT}
        listen: "${LISTEN}"
        providers: {}
        models: {}
        x: ${}
        y: ${BROKEN
        z: ${bad-name}
        w: ${CTRL}
    """, {"CTRL": "a\nb: c"})
    assert errs == [
        "${IN_COMMENT}: environment variable is not set (line 2)",
        "${LISTEN}: environment variable is not set (line 3)",
        "line 6: empty '${}' names no variable",
        "line 7: unclosed '${' (write ${NAME})",
        "line 8: '${bad-name}' is not a valid variable name",
        "${CTRL}: value contains control characters (line 9); use a {file: PATH} reference for multi-line values",
    ]


def test_interpolated_value_may_not_change_structure():
    text = """
        providers:
          mine: {protocol: openai, base_url: "https://x.example.com", api_key: {env: KEY}}
        models:
          m: {provider: mine, upstream_model: ${MODEL}}
    """
    assert cfg(text, {"KEY": "k", "MODEL": "llama3"}).models["m"].upstream_model == "llama3"
    errs = problems(text, {"KEY": "k", "MODEL": "[a, b]"})
    assert errs == ["<embedded>: an interpolated ${VAR} value changes the YAML structure (it contains YAML "
                    "syntax such as ': ', '[', '{' or '#'); quote the ${VAR} in the file"]


# --- refusals ---------------------------------------------------------------------------------


def test_unknown_key_with_suggestion_at_every_level():
    errs = problems("""
        listn: ":8080"
        providers:
          anthropic: {api_key: {env: ANTHROPIC_KEY}, base_ur: "https://x.example.com"}
        models:
          gpt: {provider: anthropic, max_concurent: 3}
        pools:
          p: {members: [{model: gpt, wieght: 2}]}
        limits: {request_body_max_byte: 1}
        advanced: {response_headers: {server_timings: true}}
        zzzzzz: 1
    """)
    assert errs == [
        "listn: unknown key (did you mean 'listen'?)",
        "zzzzzz: unknown key",
        "providers.anthropic.base_ur: unknown key (did you mean 'base_url'?)",
        "models.gpt.max_concurent: unknown key (did you mean 'max_concurrent'?)",
        "pools.p.members[0].wieght: unknown key (did you mean 'weight'?)",
        "limits.request_body_max_byte: unknown key (did you mean 'request_body_max_bytes'?)",
        "advanced.response_headers.server_timings: unknown key (did you mean 'server_timing'?)",
    ]


def test_reference_keys_not_yet_implemented_are_refused_by_name():
    errs = problems(MINIMAL + """
hooks: {}
tls: {cert: {file: c.pem}}
admin_listen: "127.0.0.1:9901"
""")
    assert not [e for e in errs if e.startswith("hooks")]     # hooks: read (busbar/hooks/config.py)
    assert "tls: missing required key 'key'" in errs
    errs = problems("""
        providers:
          anthropic: {api_key: {env: ANTHROPIC_KEY}}
        models:
          c: {provider: anthropic, prompt_caching: yes-please}
        pools:
          p: {members: [{model: c}]}
    """)
    assert errs == ["models.c.prompt_caching: expected true or false, got a string"]


def test_secret_reference_rules():
    errs = problems(f"""
        providers:
          a: {{catalog: anthropic, api_key: "{SECRET}"}}
          b: {{catalog: anthropic, api_key: {{env: NOT_SET}}}}
          c: {{catalog: anthropic, api_key: {{file: /nonexistent/key}}}}
          d: {{catalog: anthropic, api_key: {{env: X, file: /y}}}}
          e: {{catalog: anthropic, api_key: {{vault: x}}}}
          f: {{catalog: anthropic, api_key: {{module: vault}}}}
          g: {{catalog: anthropic}}
        models: {{}}
    """, {"X": "x"})
    assert errs == [
        "providers.a.api_key: inline secrets are not allowed; use {env: NAME} or {file: PATH}",
        "providers.b.api_key: environment variable NOT_SET is not set",
        "providers.c.api_key: cannot read secret file /nonexistent/key: No such file or directory",
        "providers.d.api_key: a secret reference has exactly one of 'env' or 'file'",
        "providers.e.api_key.vault: unknown key",
        "providers.f.api_key.module: secret module 'vault' is not built into busbar (built in: env, file); "
        "busbar loads no plugins",
        "providers.g: missing required key 'api_key' (only http:// loopback or private providers may omit it)",
    ]
    assert not any(SECRET in e for e in errs)


def test_empty_secret_is_a_warning_and_the_lane_still_loads():
    c = cfg(MINIMAL, {"ANTHROPIC_KEY": ""})
    assert c.providers["anthropic"].api_key == ""
    assert c.warnings == (
        "providers.anthropic.api_key: environment variable ANTHROPIC_KEY is empty; the lane starts "
        "but its upstream calls will fail auth",
    )


def test_secret_with_control_characters_is_refused_without_echo():
    errs = problems(MINIMAL, {"ANTHROPIC_KEY": "abc\r\nX-Injected: 1"})
    assert errs == ["providers.anthropic.api_key: environment variable ANTHROPIC_KEY contains control characters"]


@pytest.mark.parametrize(
    "url, message",
    [
        ("ftp://x.example.com", "must start with https:// (or http:// for a loopback or private host)"),
        ("x.example.com", "must start with https:// (or http:// for a loopback or private host)"),
        ("http://api.example.com", "http:// is allowed only for loopback and private hosts; use https://"),
        ("http://8.8.8.8", "http:// is allowed only for loopback and private hosts; use https://"),
        ("https://user:pw@x.example.com", "must not carry credentials (user:password@); use api_key"),
        ("https://x.example.com/v1?key=1", "must not have a query string or fragment"),
        ("https://x.example.com\\@evil.example",
         "must be an ASCII URL without whitespace, control characters or backslashes"),
        ("https://x.example.com/a/../b", "path must not contain '.' or '..' segments"),
        ("https://0.0.0.0", "host 0.0.0.0 is not a unicast address"),
        ("https://1.2.3.256", "host is an invalid IPv4 address"),
    ],
)
def test_bad_base_urls(url, message):
    errs = problems(f"""
        providers:
          p: {{protocol: openai, base_url: '{url}', api_key: {{env: OPENAI_KEY}}}}
        models: {{}}
    """)
    assert errs == [f"providers.p.base_url: {message}"]


@pytest.mark.parametrize(
    "url, host",
    [
        ("https://169.254.169.254/latest", "169.254.169.254"),
        ("http://169.254.169.254", "169.254.169.254"),
        ("https://2852039166", "169.254.169.254"),  # decimal
        ("https://0xa9fea9fe", "169.254.169.254"),  # hex
        ("https://0251.0376.0251.0376", "169.254.169.254"),  # octal
        ("https://169.254.43518", "169.254.169.254"),  # short form
        ("https://[::ffff:169.254.169.254]", "::ffff:a9fe:a9fe"),  # IPv4-mapped IPv6
        ("https://%31%36%39.254.169.254", "169.254.169.254"),  # percent-encoded
        ("https://100.100.100.200", "100.100.100.200"),
        ("https://168.63.129.16", "168.63.129.16"),
        ("https://[fd00:ec2::254]", "fd00:ec2::254"),
        ("https://metadata.google.internal/computeMetadata", "metadata.google.internal"),
        ("https://METADATA.google.internal./", "metadata.google.internal"),
        ("https://instance-data", "instance-data"),
    ],
)
def test_metadata_hosts_refused(url, host):
    errs = problems(f"""
        providers:
          p: {{protocol: openai, base_url: "{url}", api_key: {{env: OPENAI_KEY}}}}
        models: {{}}
    """)
    assert errs == [
        f"providers.p.base_url: host {host} is a cloud metadata endpoint, refused by the SSRF guard "
        "(allow it with allow_metadata_hosts)"
    ]


def test_metadata_allow_overrides():
    c = cfg("""
        providers:
          p: {protocol: openai, base_url: "https://169.254.10.10", api_key: {env: OPENAI_KEY},
              allow_metadata_hosts: ["169.254.10.10"]}
        models: {}
    """)
    assert c.providers["p"].host == "169.254.10.10"
    c = cfg("""
        security: {allow_all_metadata: true}
        providers:
          p: {protocol: openai, base_url: "https://metadata.internal", api_key: {env: OPENAI_KEY}}
        models: {}
    """)
    assert c.providers["p"].host == "metadata.internal"
    errs = problems("""
        security: {blocked_metadata_hosts: [secrets.corp.example]}
        providers:
          p: {protocol: openai, base_url: "https://secrets.corp.example", api_key: {env: OPENAI_KEY}}
        models: {}
    """)
    assert errs[0].startswith("providers.p.base_url: host secrets.corp.example is a cloud metadata endpoint")


def test_models_and_pools_cross_references():
    errs = problems("""
        providers:
          anthropic: {api_key: {env: ANTHROPIC_KEY}}
          openai: {api_key: {env: OPENAI_KEY}}
        models:
          claude: {provider: anthropc}
          gpt: {provider: openai}
          admin: {provider: openai}
          nop: {upstream_model: x}
        pools:
          p1: {members: [{model: gtp}]}
          gpt: {members: [{model: gpt}]}
          openai: {members: [{model: gpt}]}
          hooks: {members: [{model: gpt}]}
          empty: {members: []}
          dup: {members: [{model: gpt}, {model: gpt, weight: 2}]}
          w: {members: [{model: gpt, weight: 0}]}
    """)
    assert errs == [
        "models.claude.provider: unknown provider 'anthropc' (did you mean 'anthropic'?)",
        "models.admin: the name 'admin' is reserved",
        "models.nop: missing required key 'provider'",
        "pools.hooks: the name 'hooks' is reserved: pools.hooks is the list of hooks every pool fires",
        "pools.p1.members[0].model: unknown model 'gtp' (did you mean 'gpt'?)",
        "pools.gpt: pool name collides with model 'gpt'",
        "pools.openai: pool name collides with provider 'openai'",
        "pools.empty.members: a pool needs at least one member",
        "pools.dup.members[1].model: model 'gpt' is already a member of this pool (raise its weight instead)",
        "pools.w.members[0].weight: must be >= 1, got 0",
    ]


def test_provider_name_rules_and_missing_protocol():
    errs = problems("""
        providers:
          admin: {catalog: openai, api_key: {env: OPENAI_KEY}}
          grok: {api_key: {env: OPENAI_KEY}}
          nope: {catalog: opnai, api_key: {env: OPENAI_KEY}}
          bad: {protocol: graphql, base_url: "https://x.example.com", api_key: {env: OPENAI_KEY}}
        models: {}
    """)
    assert errs == [
        "providers.admin: the name 'admin' is reserved",
        "providers.grok: missing required key 'protocol' (not a catalog provider; did you mean 'groq'?)",
        "providers.grok: missing required key 'base_url' (not a catalog provider)",
        "providers.nope.catalog: no catalog provider 'opnai' (did you mean 'openai'?)",
        "providers.bad.protocol: unknown protocol 'graphql'",
    ]


def test_types_and_ranges():
    errs = problems("""
        listen: 8080
        providers:
          anthropic: {api_key: {env: ANTHROPIC_KEY}, auth: basic}
        models:
          c: {provider: anthropic, max_concurrent: 0, reasoning: "yes", default_max_tokens: true,
              attempt_timeout_ms: 1.5}
        limits: {idle_timeout_secs: -1, header_count_max: "100", drain_timeout_secs: .inf}
        advanced: {worker_threads: 0}
    """)
    assert errs == [
        "listen: expected \"HOST:PORT\", got an integer",
        "providers.anthropic.auth: unknown auth 'basic'",
        "models.c.max_concurrent: must be >= 1, got 0",
        "models.c.default_max_tokens: expected an integer, got a boolean",
        "models.c.reasoning: expected true or false, got a string",
        "models.c.attempt_timeout_ms: expected an integer, got a number",
        "limits.header_count_max: expected an integer, got a string",
        "limits.idle_timeout_secs: must be a finite number > 0, got -1",
        "limits.drain_timeout_secs: must be a finite number > 0, got inf",
        "advanced.worker_threads: must be >= 1, got 0",
    ]


def test_headers_rules():
    c = cfg("""
        providers:
          p: {catalog: openrouter, api_key: {env: OPENAI_KEY}, headers: {X-Proxy-Key: {env: PROXY}}}
        models: {}
    """, {**ENV, "PROXY": "proxy-secret"})
    assert c.providers["p"].headers == (("X-Proxy-Key", "proxy-secret"),)
    assert "proxy-secret" not in repr(c)
    errs = problems("""
        providers:
          p: {catalog: openrouter, api_key: {env: OPENAI_KEY},
              headers: {Authorization: x, "bad name": y, X-Ok: 3}}
        models: {}
    """)
    assert errs == [
        "providers.p.headers.Authorization: busbar sets this header itself (use api_key and auth for credentials)",
        "providers.p.headers: 'bad name' is not a valid header name",
        "providers.p.headers.X-Ok: expected a string or a secret reference, got an integer",
    ]


def test_auth_consistency():
    errs = problems("""
        providers:
          a: {catalog: anthropic, api_key: {env: ANTHROPIC_KEY}, auth: none}
          b: {catalog: ollama, auth: bearer}
        models: {}
    """)
    assert errs == [
        "providers.a.auth: auth 'none' sends no key; remove api_key or pick another auth",
        "providers.b.auth: auth 'bearer' needs an api_key",
    ]


def test_yaml_problems():
    errs = problems(MINIMAL + "models: {}\n")
    assert errs == ["<embedded>: line 6: duplicate key 'models'"]
    errs = problems("providers: [\n")
    assert len(errs) == 1 and errs[0].startswith("<embedded>: YAML error at line")
    assert problems("") == ["<embedded>: the file is empty; expected a mapping with 'providers' and 'models'"]
    assert problems("- a\n") == ["<embedded>: expected a mapping at the top level, got a list"]
    assert problems("listen: ':1'\n") == ["providers: missing required section", "models: missing required section"]


def test_yaml_error_after_interpolation_does_not_quote_the_value():
    errs = problems('providers: {a: "${V}"}\nmodels: {}\n', {"V": 'x"SECRET-IN-YAML'})
    assert len(errs) == 1 and "caused by an interpolated ${VAR} value" in errs[0]
    assert "SECRET-IN-YAML" not in errs[0]


def test_all_problems_reported_at_once():
    errs = problems(f"""
        listen: "nope"
        providers:
          a: {{catalog: anthropic, api_key: "{SECRET}"}}
          b: {{protocol: openai, base_url: "http://api.example.com", api_key: {{env: OPENAI_KEY}}}}
        models:
          m: {{provider: a, max_concurent: 2}}
        pools:
          m: {{members: [{{model: missing}}]}}
        tls: {{}}
    """)
    assert len(errs) == 8
    assert "tls: missing required key 'cert'" in errs
    assert 'listen: expected "HOST:PORT" (e.g. "0.0.0.0:8080")' in errs
    assert "pools.m: pool name collides with model 'm'" in errs
    assert "pools.m.members[0].model: unknown model 'missing'" in errs
    assert SECRET not in "\n".join(errs)


# --- secret hygiene ---------------------------------------------------------------------------


def test_repr_and_str_redact_secrets():
    c = cfg(MINIMAL)
    p = c.providers["anthropic"]
    for text in (repr(p), str(p), repr(c.models["claude"]), repr(c), str(c)):
        assert SECRET not in text
    assert "api_key='<redacted>'" in repr(p)
    keyless = cfg("providers: {ollama: }\nmodels: {}\n").providers["ollama"]
    assert "api_key=None" in repr(keyless)


def test_config_error_never_contains_secret_values(tmp_path):
    key_file = tmp_path / "k"
    key_file.write_text("AKIA:" + SECRET + ":x:y")  # 4 parts: not a sigv4 key
    with pytest.raises(ConfigError) as info:
        load(text=f"providers:\n  b: {{catalog: bedrock, api_key: {{file: {key_file}}}}}\nmodels: {{}}\n", env={})
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


# --- validate ---------------------------------------------------------------------------------


def test_validate_main_ok(tmp_path, capsys, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + "pools:\n  default: {members: [{model: claude}]}\n")
    monkeypatch.setenv("ANTHROPIC_KEY", SECRET)
    assert validate_main(str(path)) == 0
    captured = capsys.readouterr()
    assert captured.out == "ok: config valid — 1 provider(s), 1 model(s), 1 pool(s)\n"
    assert captured.err == ""


def test_validate_main_errors_and_warnings(tmp_path, capsys, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent("""
        providers:
          anthropic: {api_key: {env: EMPTY_KEY}}
          openai: {api_key: {env: UNSET_KEY_FOR_TEST}}
        models:
          gpt: {provider: openai, max_concurent: 1}
    """))
    monkeypatch.setenv("EMPTY_KEY", "")
    monkeypatch.delenv("UNSET_KEY_FOR_TEST", raising=False)
    assert validate_main(str(path)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "warning: providers.anthropic.api_key: environment variable EMPTY_KEY is empty; the lane starts "
        "but its upstream calls will fail auth",
        "error: providers.openai.api_key: environment variable UNSET_KEY_FOR_TEST is not set",
        "error: models.gpt.max_concurent: unknown key (did you mean 'max_concurrent'?)",
    ]


def test_validate_main_missing_file(tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    assert validate_main(missing) == 1
    assert capsys.readouterr().err == f"error: {missing}: cannot read config file: No such file or directory\n"


# --- the catalog ------------------------------------------------------------------------------


def test_shipped_catalog_integrity():
    out = Problems()
    catalog = config.load_catalog(config.SHIPPED_CATALOG, out)
    assert out.errors == [] and out.warnings == []
    assert len(catalog) >= 30
    local = {"ollama", "vllm", "lmstudio"}
    for name, entry in catalog.items():
        assert entry["protocol"] in config.PROTOCOLS, name
        url = entry["base_url"]
        assert not url.endswith("/"), name
        # busbar appends /v1/chat/completions itself: a /v1 here would double it.
        assert not url.rstrip("/").endswith("/v1"), name
        if name in local:
            assert url.startswith("http://127.0.0.1:"), name
        else:
            assert url.startswith("https://"), name
    openai_compatible = [n for n, e in catalog.items() if e["protocol"] == "openai" and n not in local | {"openai"}]
    assert len(openai_compatible) >= 20
    assert {e["protocol"] for e in catalog.values()} == set(config.PROTOCOLS)
    expected = {
        "anthropic": "https://api.anthropic.com",
        "openai": "https://api.openai.com",
        "openai-responses": "https://api.openai.com",
        "gemini": "https://generativelanguage.googleapis.com",
        "cohere": "https://api.cohere.com",
        "bedrock": "https://bedrock-runtime.us-east-1.amazonaws.com",
        "groq": "https://api.groq.com/openai",
        "together": "https://api.together.xyz",
        "mistral": "https://api.mistral.ai",
        "deepseek": "https://api.deepseek.com",
        "openrouter": "https://openrouter.ai/api",
        "fireworks": "https://api.fireworks.ai/inference",
        "xai": "https://api.x.ai",
        "ollama": "http://127.0.0.1:11434",
        "vllm": "http://127.0.0.1:8000",
    }
    for name, url in expected.items():
        assert catalog[name]["base_url"] == url
    assert catalog["openai-responses"]["protocol"] == "responses"


def test_every_catalog_entry_loads_as_a_provider():
    out = Problems()
    catalog = config.load_catalog(config.SHIPPED_CATALOG, out)
    lines = ["providers:"]
    env = {}
    for name, entry in catalog.items():
        if entry["base_url"].startswith("http://"):
            lines.append(f"  {name}:")
        else:
            key = "AK:SK" if entry["protocol"] in ("bedrock", "bedrock-invoke") else "k"
            env[f"K_{len(env)}"] = key
            more = ""
            if entry.get("azure") is not None:
                more = ", base_url: https://r1.openai.azure.com"
            if entry.get("vertex") is not None:
                more = ", vertex: {project: proj-1234, location: us-central1}"
            lines.append(f"  {name}: {{api_key: {{env: K_{len(env) - 1}}}{more}}}")
    lines.append("models: {}")
    c = load(text="\n".join(lines) + "\n", env=env)
    assert set(c.providers) == set(catalog)


def test_providers_file_and_deprecated_env(tmp_path):
    (tmp_path / "cat.yaml").write_text("corp:\n  protocol: openai\n  base_url: https://llm.corp.example/\n")
    text = "providers_file: cat.yaml\nproviders:\n  corp: {api_key: {env: K}}\nmodels: {}\n"
    (tmp_path / "config.yaml").write_text(text)
    c = load(str(tmp_path / "config.yaml"), env={"K": "k"})
    assert c.providers["corp"].base_url == "https://llm.corp.example"
    # The shipped catalog is replaced, not merged.
    errs = problems("providers_file: " + str(tmp_path / "cat.yaml")
                    + "\nproviders:\n  groq: {api_key: {env: K}}\nmodels: {}\n", {"K": "k"})
    assert errs[0].startswith("providers.groq: missing required key 'protocol'")
    c = load(text="providers:\n  corp: {api_key: {env: K}}\nmodels: {}\n",
             env={"K": "k", "BUSBAR_PROVIDERS": str(tmp_path / "cat.yaml")})
    assert c.providers["corp"].protocol == "openai"
    assert c.warnings == ("BUSBAR_PROVIDERS: deprecated; set providers_file: in config.yaml instead",)


def test_broken_catalog_entries_are_reported_under_the_catalog_path(tmp_path):
    cat = tmp_path / "cat.yaml"
    cat.write_text("a:\n  protocol: soap\n  base_url: https://a.example\n"
                   "b:\n  base_url: http://b.example\nc: {protocol: openai}\n")
    errs = problems(f"providers_file: {cat}\nproviders: {{}}\nmodels: {{}}\n")
    # b's http:// base_url is checked only where a provider uses it (tests/busbar/test_catalog.py)
    assert errs == [
        f"{cat}: a.protocol: unknown protocol 'soap'",
        f"{cat}: c: missing required key 'base_url'",
    ]


def test_os_environ_is_the_default_env(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_KEY", "from-os-environ")
    assert load(text=MINIMAL).providers["anthropic"].api_key == "from-os-environ"
    assert os.environ["ANTHROPIC_KEY"] == "from-os-environ"


# --- governance (issue 10) ----------------------------------------------------------------------
GOV_ENV = {"ANTHROPIC_KEY": "k", "SIGN": "ab" * 32, "REDIS": "redis://127.0.0.1:6379/0"}


def test_governance_config_parses():
    c = cfg(MINIMAL + """
auth: {chain: [keys], signing_key: {env: SIGN}}
groups:
  org: {limits: [{budget: 1250, per: month}]}
  team: {parent: org, limits: [{requests: 60, per: minute}, {concurrent: 4}, {tokens: 1000, per: hour, pool: claude}]}
rate_card:
  claude: {input_utok: 3.0, output_utok: 15.0, cache_read_utok: 0.3}
store: {module: valkey, settings: {url: {env: REDIS}, fail_mode: open}}
""", GOV_ENV)
    g = c.governance
    from busbar.governance.model import Signer
    assert g.keys and g.signing_key == Signer(b"\xab" * 32)
    assert g.groups["team"].parent == "org"
    assert g.groups["org"].limits[0].amount == 12_500_000_000      # 1250 cents in nano-units
    assert g.rate_card["claude"].nano(1_000_000, 0) == 3_000_000_000
    assert g.store.kind == "redis" and g.store.fail_mode == "open"
    assert "REDIS" not in repr(g) and "ab" * 32 not in repr(g) and "ab" * 32 not in repr(g.signing_key)
    # no governance at all: an open relay, nothing counted
    assert cfg(MINIMAL, GOV_ENV).governance is None


def test_governance_config_problems():
    errs = problems(MINIMAL + """
auth: {chain: [keys, ldap]}
groups:
  a: {parent: b, limits: [{requests: 1}]}
  b: {parent: a, limits: [{requests: 1, tokens: 2, per: day}, {concurrent: 2, per: day}]}
  c: {parent: nowhere, limits: [{budget: -1, per: day}, {requests: 5, per: week},
                                {requests: 1, per: minute, pool: nope}]}
rate_card:
  ghost: {input_utok: 1, output_utok: 1}
store: {module: postgres}
""", GOV_ENV)
    for want in (
        "auth.chain[1]: unknown identity provider 'ldap' (built in: keys; or a name under identity-providers)",
        "auth.signing_key: required when auth.chain has 'keys' (a secret reference, the same on every instance; "
        "e.g. {env: BUSBAR_SIGNING_KEY})",
        "groups.a.limits[0].per: expected one of minute, hour, day, month, total",
        "groups.b.limits[0]: a limit has exactly one of requests, tokens, budget, concurrent",
        "groups.b.limits[1].per: a concurrent limit has no period",
        "groups.c.limits[0].budget: expected a positive integer (cents)",
        "groups.c.limits[1].per: expected one of minute, hour, day, month, total",
        "groups.c.limits[2].pool: unknown pool or model 'nope'",
        "rate_card.ghost: unknown model 'ghost'",
        "rate_card: covers no rate for model(s) claude; add them (stub: claude: {input_utok: 0.0, output_utok: 0.0})",
        "store.settings: module postgres needs url (postgres://user@host:5432/db)",
    ):
        assert want in errs, (want, errs)
    errs = problems(MINIMAL + """
auth: {chain: [keys], signing_key: {env: SHORT}}
groups:
  a: {parent: b}
  b: {parent: a}
""", dict(GOV_ENV, SHORT="short"))
    assert any(e.startswith("auth.signing_key: must be an ed25519 signing key: 64 hex characters")
               and "busbar --generate-signing-key" in e for e in errs), errs
    assert any(e.startswith("groups.a.parent: groups form a cycle: a -> b -> a") for e in errs), errs
    errs = problems(MINIMAL + "store: {module: valkey}\n", GOV_ENV)
    assert "store.settings: module valkey needs url (redis:// or rediss://)" in errs


def test_redis_url_inline_without_a_password_but_a_reference_with_one():
    # An address is not a secret: written inline it is taken as it is.
    for url in ("redis://127.0.0.1:6379", "rediss://redis.internal:6380/2", "unix:///run/redis.sock"):
        c = cfg(MINIMAL + "store: {module: valkey, settings: {url: \"%s\"}}\n" % url, GOV_ENV)
        assert c.governance.store.url == url and url not in repr(c.governance)
    # A password (in the user info or as a parameter) is: refused inline, never echoed.
    for url in ("redis://:hunter2pw@127.0.0.1:6379/0", "redis://app:hunter2pw@127.0.0.1:6379",
                "rediss://hunter2pw@redis.internal:6380", "redis://127.0.0.1:6379/0?password=hunter2pw",
                "unix:///run/redis.sock?username=app&password=hunter2pw"):
        errs = problems(MINIMAL + "store: {module: valkey, settings: {url: \"%s\"}}\n" % url,
                        GOV_ENV)
        assert errs == ["store.settings.url: this URL carries credentials, and inline secrets are not "
                        "allowed; put the whole URL in a reference, e.g. url: {env: BUSBAR_REDIS_URL}"]
        assert not any("hunter2pw" in e for e in errs)
    # The same URL behind a reference is fine.
    c = cfg(MINIMAL + "store: {module: valkey, settings: {url: {env: REDIS}}}\n",
            dict(GOV_ENV, REDIS="redis://:hunter2pw@127.0.0.1:6379/0"))
    assert c.governance.store.url == "redis://:hunter2pw@127.0.0.1:6379/0"
    # Inline, the scheme is still checked.
    assert problems(MINIMAL + "store: {module: valkey, settings: {url: \"http://127.0.0.1:6379\"}}\n",
                    GOV_ENV) == ["store.settings.url: expected a redis://, rediss:// or unix:// URL"]


def test_a_config_needing_a_package_this_install_lacks_is_one_line(monkeypatch):
    from busbar.config import modules
    monkeypatch.setattr(modules, "lacks", lambda m: m in ("redis", "aiohttp"))
    valkey = "store: {module: valkey, settings: {url: {env: REDIS}}}\n"
    errs = problems(MINIMAL + valkey + "export: {traces: {module: otlp, settings: "
                    "{url: \"https://collector.example.com:4318/v1/traces\"}}}\n", GOV_ENV)
    assert errs == [
        "export.traces.settings: otlp (trace export) needs the Python package `aiohttp`; this "
        "install lacks it (pip install 'aiohttp==%s')" % _pinned("aiohttp"),
        "store.module: store valkey needs the Python package `redis`; this install lacks it "
        "(pip install 'redis==%s')" % _pinned("redis")]
    # validate --offline lints for another install (CI): a warning, not an error
    from busbar.config.secrets import OfflineEnv
    _, out = config.build(text=MINIMAL + valkey,
                          env=OfflineEnv(GOV_ENV), offline=True)
    assert not out.errors and any("`redis`" in w for w in out.warnings)
    # the single-file executable carries every one (pip cannot add to it): only a broken build
    # lacks one, and the line says so
    monkeypatch.setattr("sys.frozen", True, raising=False)
    errs = problems(MINIMAL + valkey, GOV_ENV)
    assert errs == ["store.module: store valkey needs the Python package `redis`; this executable was "
                    "built without it (a packaging error: packaging/busbar.spec must carry every "
                    "module busbar imports on demand); `pip install busbar` has it"]


def _pinned(dist):
    import tomllib
    with open(os.path.join(os.path.dirname(config.__file__), "..", "..", "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if d.split("==")[0].lower() == dist)


def test_every_optional_package_is_a_pinned_runtime_dependency():
    from busbar.config import modules
    for module, dist in modules.OPTIONAL.items():
        assert modules.requirement(dist) == "%s==%s" % (dist, _pinned(dist.lower()))
        assert not modules.lacks(module), module       # the dev install has every one
