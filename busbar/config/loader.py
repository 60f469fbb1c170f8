"""config.yaml + the providers.yaml catalog -> a validated, frozen Config (SPEC §2).

The pipeline: read -> `${VAR}` interpolation -> YAML (duplicate keys refused) -> every section
checked, every problem collected -> secrets resolved -> Config. Nothing here touches the network:
`busbar validate` runs exactly this and stops.

Problems are strings "<path>: <message>", where <path> is the key's dotted path in the file
(`models.gpt.max_concurrent`, `pools.fast.members[0].weight`), a variable (`${NAME}`), or a file.
"""
from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import re
import sys
from typing import Mapping

import yaml

from .checks import (
    Problems,
    check_keys,
    describe,
    get_bool,
    get_int,
    get_mapping,
    get_seconds,
    get_str,
    has_control,
    join,
    suggest,
)
from .interpolate import interpolate, same_shape
from .legacy import EARLIER_DEFAULT_DB, markers
from .modules import require
from .schema import (
    AUTH_MODES,
    AWS_PROTOCOLS,
    DEFAULT_AUTH,
    LIMIT_INT_FLOORS,
    LIMIT_SECONDS,
    PROTOCOLS,
    Config,
    Limits,
    Member,
    Model,
    Pool,
    Provider,
)
from .control import apply_overlay, overlay_entries_at_fault, overlay_path, parse_control
from .secrets import OFFLINE_PLACEHOLDER, OfflineEnv, resolve_secret, secrets_section
from .urls import HostPolicy, normalize_host, parse_base_url
from busbar.governance.config import parse as _governance
from busbar.hooks import config as hooks_config
from busbar.hooks.config import STRATEGIES
from busbar.observability.settings import parse_export as _export
from busbar.reliability import config as reliability_config
from cbusbar.proto import codec

CONFIG_ENV = "BUSBAR_CONFIG"
PROVIDERS_ENV = "BUSBAR_PROVIDERS"  # deprecated in favour of `providers_file:`, still honoured
DEFAULT_CONFIG_PATH = "config.yaml"
SHIPPED_CATALOG = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                               "data", "providers.yaml")   # (os.path: pathlib is not loaded at boot)

DEFAULT_LISTEN = ("0.0.0.0", 8080)

TOP_LEVEL_KEYS = (
    "listen", "providers_file", "providers", "models", "pools", "limits", "advanced", "security",
    # control plane (busbar/config/control.py)
    "admin_listen", "admin_tls", "admin_require_mtls", "tls", "auth", "config",
    # governance (busbar/governance/config.py)
    "groups", "rate_card", "store", "identity-providers", "per_request_fee",
    # accepted blocks: plugins (none are loaded), routing (the hooks' default timeout)
    "plugins", "routing",
    # observability in the Rust grammar (busbar/observability/settings.py parse_export)
    "export",
    # the gateway's own public address (checked; what browser logins return to)
    "public_url",
    # secret modules' own settings (busbar/config/secrets.py)
    "secrets",
    # hook definitions (busbar/hooks/config.py), attached by name from pools
    "hooks",
    # reliability: process-wide probe defaults (busbar/reliability/config.py)
    "health",
)
# The reference's remaining top-level keys (SPEC §2.1): refused by name until implemented.
TOP_LEVEL_UNSUPPORTED = ()

# A catalog entry: the reference's fields, then busbar's own (region, azure, vertex). Any other key
# is ignored with a warning, as the reference ignores it (its catalog has no unknown-key rule).
CATALOG_KEYS = (
    "protocol", "base_url", "error_map", "path", "path_base", "auth", "token_url", "scope",
    "subject", "health", "allow_metadata_hosts", "region", "azure", "vertex",
)
# The Rust grammar's self-minting OAuth auth styles: `jwt-bearer` (a service account's signed
# assertion, RFC 7523: busbar's `oauth2` with the account in api_key) and
# `oauth-client-credentials` (RFC 6749 §4.4: CLIENT_ID:CLIENT_SECRET traded at token_url).
CATALOG_FOREIGN_AUTH = ("jwt-bearer", "oauth-client-credentials")
# What a catalog is called beside config.yaml, read when providers_file: is absent.
CATALOG_BESIDE = "providers.yaml"

PROVIDER_KEYS = (
    "catalog", "protocol", "base_url", "api_key", "auth", "region", "headers",
    "allow_metadata_hosts", "profile", "role_arn", "credentials", "token_url", "vertex", "azure",
    "error_map", "upstream_credentials", "health",  # reliability
    "path",     # the request path in place of the protocol's (the Rust grammar)
    "path_base",    # the base of a URL-model protocol's paths (Vertex AI, the Rust grammar)
    "scope", "subject",     # the OAuth grants' (auth: oauth-client-credentials, jwt-bearer)
)
PROVIDER_UNSUPPORTED = ()
AZURE_KEYS = ("deployment", "api_version")
VERTEX_KEYS = ("project", "location")
# The catalog's placeholder host for Azure OpenAI: every resource has its own host.
AZURE_PLACEHOLDER_HOST = "your-resource.openai.azure.com"

MODEL_KEYS = (
    "provider", "upstream_model", "max_concurrent", "default_max_tokens", "reasoning",
    "attempt_timeout_ms", "operations", "max_requests", "prompt_caching",
)
# What a model can serve. Token counting rides on chat (a chat model counts its own tokens).
OPERATIONS = ("chat", "embeddings")
# Embedding models are named so by every vendor (text-embedding-3-small, gemini-embedding-001,
# embed-v4.0, amazon.titan-embed-text-v2:0, cohere.embed-english-v3): the default follows the name.
_EMBED_NAME = re.compile(r"embed", re.IGNORECASE)
MODEL_UNSUPPORTED = ()

POOL_KEYS = ("members", "breaker", "failover", "on_exhausted", "hooks", "affinity",
             "upstream_credentials")
POOL_UNSUPPORTED = ()
MEMBER_KEYS = ("model", "weight", "reasoning", "context_max", "attempt_timeout_ms", "tier", "tags")
MEMBER_UNSUPPORTED = ()
# `pools:` holds two section-wide keys beside the pools: the hooks every pool fires and the
# default of whose credentials go upstream (a pool's own value replaces it).
POOLS_SECTION_KEYS = ("hooks", "upstream_credentials")
UPSTREAM_CREDENTIALS = ("own", "passthrough")
AFFINITY_KEYS = ("mode", "header_name")
# The Rust default session header.
DEFAULT_AFFINITY_HEADER = "x-session-id"

LIMITS_UNSUPPORTED = ()
# Caps on what a principal provisions for itself, checked here (>= 0, 0 = unlimited) and enforced by
# the admin API (busbar/governance/admin.py): live keys per group on a mint, rebind or re-enable;
# the group count a mint's auto-provisioning may grow to.
LIMITS_SELF_SERVICE = ("max_keys_per_principal", "max_auto_provisioned_groups")
# The reasoning budget each effort level maps to by default (cbusbar/reasoning.pyx), as the Rust
# grammar's `limits.reasoning_effort_budgets` spells them.
REASONING_EFFORT_BUDGETS = dict(zip(("minimal", "low", "medium", "high"),
                                    Limits().reasoning_effort_budgets))
ADVANCED_KEYS = ("worker_threads", "response_headers", "rate_sweep_interval",
                 "usage_flush_interval_ms", "upstream_http1_only", "upstream_h2_prior_knowledge")
ADVANCED_UNSUPPORTED = ()
# `plugins:` is accepted as a block (busbar loads no plugins: its stores, identity providers and
# secret modules are built in).
PLUGINS_KEYS = ("enabled", "dir", "trust", "min_versions", "fetch")
ROUTING_KEYS = ("default_policy_timeout_ms",)
RESPONSE_HEADERS_KEYS = ("server_timing",)
RESPONSE_HEADERS_UNSUPPORTED = ("route_policy",)
SECURITY_KEYS = ("blocked_metadata_hosts", "allow_metadata_hosts", "allow_all_metadata")

RESERVED_PROVIDER_NAMES = ("admin",)
RESERVED_MODEL_NAMES = ("admin",)
RESERVED_POOL_NAMES = ("admin", "hooks", "upstream_credentials")

# Provider names appear in URLs (`/{provider}/{model}/v1/messages`) and metric labels.
_PROVIDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
# Model and pool names are what clients send; anything printable without spaces.
_TARGET_NAME = re.compile(r"[^\s\x00-\x1f\x7f]+\Z")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+\Z")
_BEDROCK_HOST = re.compile(r"bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?\Z")
_BEDROCK_REGION_IN_URL = re.compile(r"(bedrock-runtime(?:-fips)?\.)[a-z0-9-]+\.amazonaws\.com")
_HOSTNAME = re.compile(r"[A-Za-z0-9_.-]+\Z")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]+\Z")
_PROFILE = re.compile(r"[\w+=,.@:-]+\Z")
# GCP project ids (6-30 chars) and Vertex locations ("us-central1", "europe-west4", "global").
_GCP_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]\Z|[a-z0-9.:-]+\Z")
_GCP_LOCATION = re.compile(r"[a-z]+(-[a-z]+[0-9]*)*\Z")
_AZURE_SEGMENT = re.compile(r"[A-Za-z0-9._-]+\Z")

# Egress headers busbar builds itself (SPEC §1.2): framing, auth, and SigV4-signed headers.
RESERVED_HEADERS = frozenset(
    {
        "host", "content-length", "content-type", "transfer-encoding", "connection", "keep-alive",
        "te", "trailer", "upgrade", "proxy-connection", "expect", "authorization", "x-api-key",
        "x-goog-api-key", "api-key", "x-amz-date", "x-amz-security-token",
        "x-amz-content-sha256",
    }
)


class ConfigError(Exception):
    """The config is invalid. `problems` holds every "<path>: <message>"; str() joins them."""

    def __init__(self, problems: list[str], warnings: list[str] | None = None) -> None:
        self.problems = list(problems)
        self.warnings = list(warnings or ())
        super().__init__("\n".join(self.problems))

    def __str__(self) -> str:
        return "\n".join(self.problems)


def load(
    path: str | None = None, *, text: str | None = None, env: Mapping[str, str] = os.environ
) -> Config:
    """Loads and validates a config: from `text` (e.g. the embedded demo config) when given,
    otherwise from `path`, $BUSBAR_CONFIG, or ./config.yaml. Raises ConfigError."""
    config, out = build(path, text=text, env=env)
    if out.errors or config is None:
        raise ConfigError(out.errors, out.warnings)
    return config


def validate_main(path: str | None, offline: bool = False) -> int:
    """`busbar validate`: exit status 0 with an "ok:" line on stdout, or 1 with one line per
    problem on stderr. Warnings go to stderr either way. `offline`: secrets and ${VAR} need not
    be present (CI lints a config without the production environment)."""
    env = OfflineEnv(os.environ) if offline else os.environ
    config, out = build(path, env=env, offline=offline)
    for name in sorted(getattr(env, "missing", ())):
        print(f"note: ${{{name}}} is not set (offline: checked with a placeholder)", file=sys.stderr)
    for warning in out.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if out.errors or config is None:
        for error in out.errors:
            print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"ok: config valid — {len(config.providers)} provider(s), "
        f"{len(config.models)} model(s), {len(config.pools)} pool(s)"
    )
    return 0


def build(
    path: str | None = None, *, text: str | None = None, env: Mapping[str, str] = os.environ,
    base_dir: str | None = None, offline: bool = False, overlay: bool = True,
    overlay_strict: bool = False,
) -> tuple[Config | None, Problems]:
    """The whole pipeline, returning the Config (None when there are errors) and every problem.
    `base_dir`: where relative files resolve for a `text` config (default: the working folder;
    given, it is also where a providers.yaml beside the config is looked for);
    `offline`: secrets are not resolved (busbar validate --offline); `overlay`: apply the overlay
    file of a mutable config (busbar/admin/live.py writes it); an overlay entry that does not
    validate is left out with a warning, unless `overlay_strict` (the admin API's own writes,
    which must refuse an invalid change)."""
    out = Problems()
    if text is None:
        given = path is not None
        if path is None:
            path = env.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            if not given and isinstance(exc, FileNotFoundError):
                out.errors.append(_where_looked(path, env))
                return None, out
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            out.error(path, f"cannot read config file: {reason}")
            return None, out
        source = path
        located = True
        base_dir = os.path.dirname(os.path.abspath(path))
    else:
        source = "<embedded>"
        located = base_dir is not None     # a catalog beside it is looked for in base_dir only
        base_dir = base_dir or os.getcwd()

    doc = _parse(text, source, env, out)
    if doc is None or _retired(doc, "`busbar --migrate-config %s` converts the file"
                               % (path if source == path else "FILE"), out):
        _scrub(out, text, env)
        return None, out
    base = doc
    groups_sink = None
    if overlay and not offline and source != "<embedded>":
        groups_sink = {}
        merged = apply_overlay(doc, base_dir, out, groups_sink=groups_sink)
        if merged is not doc and _retired(
                merged, "in the overlay %s, which an earlier busbar wrote: apply the migrated "
                "config again, or move the overlay away" % overlay_path(doc, base_dir), out):
            return None, out
        doc = merged
    before = list(out.warnings)
    config = _build_config(doc, source, base_dir, env, out, offline, located=located)
    if out.errors and doc is not base and not overlay_strict:
        config, out = _without_bad_overlay_entries(base, out, before, source, base_dir, env,
                                                   offline, located)
    _scrub(out, text, env)
    if out.errors:
        return None, out
    if groups_sink:
        config = dataclasses.replace(config, overlay_groups=groups_sink)
    return config, out


def _without_bad_overlay_entries(base, out, before, source, base_dir, env, offline, located):
    """A bad overlay never bricks a start (the Rust gateway's rule): when every problem of the
    config is about entries of the overlay (a hook whose secret is gone, an exporter this version
    does not know), those entries are left out, with a warning each, and the rest is served."""
    dropped: set = set()
    for _ in range(3):      # leaving entries out can show a problem they hid; a few rounds
        fault = overlay_entries_at_fault(base, base_dir, out.errors)
        if not fault:
            return None, out
        dropped |= fault
        again = Problems()
        again.warnings = list(before)
        doc = apply_overlay(base, base_dir, again, drop=frozenset(dropped))
        for section, name in sorted(dropped):
            again.warn("config.overlay", f"{section}.{name}: left out: it does not validate "
                       f"({'; '.join(e for e in out.errors if e.startswith((section + '.' + name, name)))})")
        config = _build_config(doc, source, base_dir, env, again, offline, located=located)
        out = again
        if not out.errors:
            return config, out
    return None, out


def _retired(doc: dict, how: str, out: Problems) -> bool:
    """Refuses each shape of an earlier grammar that `doc` still holds (busbar/config/legacy.py:
    the Rust gateway's 1.x keys and busbar's own earlier spellings), one line apiece naming its
    path and where it went, and True when there was one. Nothing else is checked then: every
    other message would be about keys the migrator is about to move. `how`: what converts it."""
    found = markers(doc)
    for where, home in found:
        out.error(where, f"retired; write {home} instead ({how})")
    return bool(found)


def _where_looked(path: str, env: Mapping[str, str]) -> str:
    """No --config and no file where busbar looked: say where that was and how to point it."""
    where = os.path.abspath(path)
    if env.get(CONFIG_ENV):
        looked = f"${CONFIG_ENV} names {where}, which does not exist"
    else:
        looked = f"no config file: --config was not given, ${CONFIG_ENV} is not set, and there is no {where}"
    return (f"{looked}; point busbar at one with --config PATH or ${CONFIG_ENV}=PATH "
            f"(or try `busbar serve --demo`, which needs none)")


_VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _scrub(out: Problems, text: str, env: Mapping[str, str]) -> None:
    """No problem line ever quotes an interpolated value: a message that would (a URL whose port
    or host came from ${VAR}) names the variable instead. Values shorter than 4 characters are
    left alone: replacing every "80" or "1" in a message would garble it and hide nothing."""
    values = {}
    for name in set(_VAR_REF.findall(text)):
        v = env.get(name)
        if v and len(v) >= 4:
            values[v] = "${%s}" % name
    if not values:
        return
    ordered = sorted(values.items(), key=lambda kv: -len(kv[0]))

    def clean(line: str) -> str:
        for v, ref in ordered:
            if v in line:
                line = line.replace(v, ref)
        return line

    out.errors[:] = [clean(e) for e in out.errors]
    out.warnings[:] = [clean(w) for w in out.warnings]


# --- YAML -------------------------------------------------------------------------------------


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that records duplicate keys: YAML keeps the last one silently, and a config
    whose second `api_key:` quietly wins is a config nobody reviewed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = key_node.value
                    if key in seen:
                        self.duplicates.append(
                            f"line {key_node.start_mark.line + 1}: duplicate key '{key}'"
                        )
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_load(text: str) -> tuple[object, list[str]]:
    loader = _Loader(text)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()



def _loaded_as_written(doc, duplicates, shadow, where: str, out: Problems) -> bool:
    """Reports duplicate keys, and False when an interpolated ${VAR} changed the document's shape
    (its value held YAML syntax): `shadow` is the text with placeholders in place of the values."""
    for duplicate in duplicates:
        out.error(where, duplicate)
    if shadow is None:
        return True
    try:
        shadow_doc, _ = _yaml_load(shadow)
    except yaml.YAMLError:
        shadow_doc = None
    if same_shape(doc, shadow_doc):
        return True
    out.error(where, "an interpolated ${VAR} value changes the YAML structure (it contains YAML "
              "syntax such as ': ', '[', '{' or '#'); quote the ${VAR} in the file")
    return False


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # Only position and problem: the context snippet could quote an interpolated secret.
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or exc.__class__.__name__
    if mark is not None:
        return f"YAML error at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"YAML error: {problem}"


def _parse(text: str, source: str, env: Mapping[str, str], out: Problems) -> dict | None:
    interp_problems: list[str] = []
    real, shadow = interpolate(text, env, interp_problems)
    if interp_problems:
        out.errors.extend(interp_problems)
        return None
    try:
        doc, duplicates = _yaml_load(real)
    except yaml.YAMLError as exc:
        message = _yaml_problem(exc)
        if shadow is not None:
            try:
                _yaml_load(shadow)
                message += " (caused by an interpolated ${VAR} value)"
            except yaml.YAMLError:
                pass
        out.error(source, message)
        return None
    if not _loaded_as_written(doc, duplicates, shadow, source, out):
        return None
    if doc is None:
        out.error(source, "the file is empty; expected a mapping with 'providers' and 'models'")
        return None
    if not isinstance(doc, dict):
        out.error(source, f"expected a mapping at the top level, got {describe(doc)}")
        return None
    return doc


# --- sections ---------------------------------------------------------------------------------


def _build_config(
    doc: dict, source: str, base_dir: str, env: Mapping[str, str], out: Problems,
    offline: bool = False, located: bool = True,
) -> Config | None:
    check_keys(doc, "", TOP_LEVEL_KEYS, out, TOP_LEVEL_UNSUPPORTED)
    for required in ("providers", "models"):
        if required not in doc:
            out.error(required, "missing required section")

    listen_host, listen_port = _listen(doc.get("listen"), out)
    policy = _security(get_mapping(doc, "security", "", out), out)
    catalog = _catalog(doc, base_dir, env, out, beside=located)

    providers_doc = get_mapping(doc, "providers", "", out) or {}
    models_doc = get_mapping(doc, "models", "", out) or {}
    pools_doc = get_mapping(doc, "pools", "", out) or {}

    health_defaults = reliability_config.health_defaults(get_mapping(doc, "health", "", out), out)
    providers: dict[str, Provider] = {}
    for name, entry in providers_doc.items():
        provider = _provider(name, entry, catalog, policy, env, base_dir, out, health_defaults)
        if provider is not None:
            providers[name] = provider

    models: dict[str, Model] = {}
    for name, entry in models_doc.items():
        model = _model(name, entry, providers, providers_doc, out)
        if model is not None:
            models[name] = model

    pools: dict[str, Pool] = {}
    for key in POOLS_SECTION_KEYS:
        if isinstance(pools_doc.get(key), dict):
            out.error(join("pools", key), f"the name '{key}' is reserved: pools.{key} is "
                      + ("the list of hooks every pool fires" if key == "hooks" else
                         "every pool's default (own or passthrough)"))
    hooks = hooks_config.parse(doc.get("hooks"), env, base_dir, out, _hook_timeout(doc))
    section_hooks = () if isinstance(pools_doc.get("hooks"), dict) else _pool_hooks(
        pools_doc.get("hooks"), "pools.hooks", out)
    hooks_config.check_refs(section_hooks, "pools.hooks", hooks, out, own=False)
    section_creds = "own" if isinstance(pools_doc.get("upstream_credentials"), dict) else \
        _upstream_credentials(pools_doc, "pools", out, "own")
    for name, entry in pools_doc.items():
        if name in POOLS_SECTION_KEYS:
            continue
        pool = _pool(name, entry, models, models_doc, providers_doc, out, section_hooks,
                     section_creds, hooks)
        if pool is not None:
            pools[name] = pool

    reliability_config.check_fallbacks(pools, out)
    _inert_keys(section_creds, pools, providers, out)
    limits = _limits(get_mapping(doc, "limits", "", out), out)
    workers, server_timing = _advanced(get_mapping(doc, "advanced", "", out), out)
    _plugins(get_mapping(doc, "plugins", "", out), out)
    _routing(get_mapping(doc, "routing", "", out), out)
    _public_url(doc, policy, out)
    secrets_section(doc.get("secrets"), out)
    # observability: parsed by its own module (busbar/observability/settings.py).
    observability = _export(get_mapping(doc, "export", "", out), env, base_dir, out)
    control = parse_control(doc, base_dir, env, out, lambda v, k: _listen(v, out, k), offline)
    # governance: keys, groups, rate card, store (busbar/governance/config.py).
    auth_doc = doc.get("auth") if isinstance(doc.get("auth"), dict) else {}
    governance = _governance(doc, auth_doc, models, pools, env, base_dir, out, offline)
    if governance is not None and governance.store.kind == "memory":
        _memory_store(doc, governance, base_dir if located else None, out)
    if out.errors:
        return None
    return Config(
        listen_host=listen_host,
        listen_port=listen_port,
        workers=workers,
        providers=providers,
        models=models,
        pools=pools,
        limits=limits,
        server_timing=server_timing,
        source=source,
        observability=observability,
        warnings=tuple(out.warnings),
        control=control,
        governance=governance,
        hooks={n: h for n, h in hooks.items() if h is not None},
        document=doc,
        upstream_credentials=section_creds,
    )


def _memory_store(doc: dict, governance, base_dir: str | None, out: Problems) -> None:
    """What boot says of a store kept in memory (the default when there is no `store:`): a SQLite
    file busbar's earlier default wrote beside the config is named with the line that keeps
    using it, once (busbar before issue #36 stored there with no `store:` at all); else, with
    minted keys, that they go at a restart, as the Rust gateway warns."""
    earlier = os.path.join(base_dir, EARLIER_DEFAULT_DB) if base_dir is not None else None
    if "store" not in doc and earlier is not None and os.path.exists(earlier):
        out.warn("store", f"none is configured, so keys, groups and spend live in memory (the "
                 f"default) and {earlier}, busbar's earlier default store, is not read; to keep "
                 f"using it add: store: {{module: sqlite, settings: {{db_path: {earlier}}}}}")
    elif governance.keys:
        out.warn("store", "memory: minted keys, usage and revocations are lost at a restart; "
                 "choose a durable store.module (sqlite, valkey) to keep them")


def _listen(value: object, out: Problems, key: str = "listen") -> tuple[str, int]:
    if value is None:
        return DEFAULT_LISTEN
    if not isinstance(value, str):
        out.error(key, f"expected \"HOST:PORT\", got {describe(value)}")
        return DEFAULT_LISTEN
    if value.startswith("["):
        close = value.find("]")
        host, sep, port_text = value[1:close], value[close + 1 : close + 2], value[close + 2 :]
        if close < 0 or sep != ":" or ":" not in host:
            out.error(key, "expected \"[IPv6]:PORT\"")
            return DEFAULT_LISTEN
        if not _valid_ip(host):
            out.error(key, "host is not a valid IPv6 address")
            return DEFAULT_LISTEN
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            out.error(key, "expected \"HOST:PORT\" (e.g. \"0.0.0.0:8080\")")
            return DEFAULT_LISTEN
        if ":" in host:
            out.error(key, "write an IPv6 host in brackets: \"[::1]:8080\"")
            return DEFAULT_LISTEN
        host = host or DEFAULT_LISTEN[0]
        if not _HOSTNAME.match(host):
            out.error(key, "host is not a valid address or host name")
            return DEFAULT_LISTEN
    if not port_text.isdigit() or int(port_text) > 65535:
        out.error(key, "port must be a number 0-65535")
        return DEFAULT_LISTEN
    return host, int(port_text)


def _valid_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_list(value: object, path: str, out: Problems) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(h, str) and h for h in value):
        out.error(path, f"expected a list of host names or addresses, got {describe(value)}")
        return frozenset()
    return frozenset(normalize_host(h) for h in value)


def _security(section: dict | None, out: Problems) -> HostPolicy:
    if section is None:
        return HostPolicy()
    check_keys(section, "security", SECURITY_KEYS, out)
    return HostPolicy(
        blocked=_host_list(section.get("blocked_metadata_hosts"), "security.blocked_metadata_hosts", out),
        allowed=_host_list(section.get("allow_metadata_hosts"), "security.allow_metadata_hosts", out),
        allow_all=bool(get_bool(section, "allow_all_metadata", "security", out, False)),
    )


def _catalog(
    doc: dict, base_dir: str, env: Mapping[str, str], out: Problems, beside: bool = True
) -> dict[str, dict]:
    """Which catalog a config uses: `providers_file:` (relative to the config's folder), else the
    deprecated $BUSBAR_PROVIDERS, else providers.yaml beside the config when there is one, else
    the catalog busbar ships. The config key wins over the variable, as the reference's 1.5.3
    release notes say ("the config key wins if you set both") and its configuration reference
    calls the variable a deprecated fallback. `beside`: the config has a folder of its own (a
    file, or text given a base_dir); an embedded config has none to look in."""
    configured = get_str(doc, "providers_file", "", out)
    from_env = env.get(PROVIDERS_ENV)
    if configured is not None:
        path = os.path.join(base_dir, os.path.expanduser(configured))
        if from_env:
            out.warn(PROVIDERS_ENV, "deprecated, and ignored: providers_file: in config.yaml wins")
    elif from_env:
        path = from_env
        out.warn(PROVIDERS_ENV, "deprecated; set providers_file: in config.yaml instead")
    elif beside and os.path.exists(os.path.join(base_dir, CATALOG_BESIDE)):
        path = os.path.join(base_dir, CATALOG_BESIDE)
    else:
        path = SHIPPED_CATALOG
    return load_catalog(path, out, env=env)


# An origin-form request target (RFC 9110 §7.1): an absolute path and an optional query, of
# RFC 3986 pchar, '/' and '?' only, so it can go on the request line as written.
_REQUEST_PATH = re.compile(r"/[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*\Z")


def _request_path(value: object, where: str, out: Problems) -> str | None:
    """A catalog's or provider's `path` / `path_base`."""
    if not isinstance(value, str):
        out.error(where, f"expected a path starting with '/', got {describe(value)}")
        return None
    if not value.startswith("/"):
        out.error(where, "must start with '/' (it is the whole request path after base_url)")
        return None
    if not _REQUEST_PATH.match(value):
        out.error(where, "a path is ASCII letters, digits and -._~%!$&'()*+,;=:@/? (no spaces, "
                         "no '#', percent-encode anything else)")
        return None
    return value


def load_catalog(
    path: str, out: Problems, env: Mapping[str, str] | None = None
) -> dict[str, dict]:
    """The catalog's entries as {name: {protocol, base_url, error_map, path, ...}}, each checked;
    broken entries are reported (under the catalog's path) and left out. `${VAR}` is expanded as
    in config.yaml (`env`: default os.environ). A base_url is checked where a provider uses it
    (the SSRF guard needs the provider's allow list), not here."""
    env = os.environ if env is None else env
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        out.error(path, f"cannot read provider catalog: {reason}")
        return {}
    local = Problems()
    interp_problems: list[str] = []
    real, shadow = interpolate(text, env, interp_problems)
    if interp_problems:
        out.errors.extend(f"{path}: {problem}" for problem in interp_problems)
        return {}
    try:
        doc, duplicates = _yaml_load(real)
    except yaml.YAMLError as exc:
        out.error(path, _yaml_problem(exc))
        return {}
    if not _loaded_as_written(doc, duplicates, shadow, path, out):
        return {}
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        out.error(path, f"expected a mapping of provider name -> entry, got {describe(doc)}")
        return {}
    catalog: dict[str, dict] = {}
    for name, entry in doc.items():
        if not isinstance(name, str) or not _PROVIDER_NAME.match(name):
            local.error(str(name), "catalog names are letters, digits, '.', '_' and '-'")
            continue
        if not isinstance(entry, dict):
            local.error(name, f"expected a mapping, got {describe(entry)}")
            continue
        before = len(local.errors)
        for key in entry:
            if key not in CATALOG_KEYS:
                hint = ("; the key goes in config.yaml (providers." + name + ".api_key)"
                        if key == "api_key" else suggest(str(key), CATALOG_KEYS))
                local.warn(join(name, key), "unknown catalog key, ignored" + hint)
        # SPEC §2.2: a catalog entry's protocol defaults to anthropic.
        protocol = get_str(entry, "protocol", name, local, "anthropic")
        if protocol not in PROTOCOLS:
            local.error(join(name, "protocol"), f"unknown protocol '{protocol}'{suggest(str(protocol), PROTOCOLS)}")
        if "base_url" not in entry:
            local.error(name, "missing required key 'base_url'")
        else:
            get_str(entry, "base_url", name, local)
        auth = get_str(entry, "auth", name, local)
        if auth is not None and auth not in AUTH_MODES + CATALOG_FOREIGN_AUTH:
            local.error(join(name, "auth"), f"unknown auth '{auth}'{suggest(auth, AUTH_MODES + CATALOG_FOREIGN_AUTH)}")
        paths = {}
        for key in ("path", "path_base"):
            if entry.get(key) is not None:
                paths[key] = _request_path(entry[key], join(name, key), local)
        for key in ("token_url", "scope", "subject"):
            get_str(entry, key, name, local)
        region = get_str(entry, "region", name, local)
        if region is not None and not _REGION.match(region):
            local.error(join(name, "region"), "expected an AWS region such as us-east-1")
        azure = get_mapping(entry, "azure", name, local)
        vertex = get_mapping(entry, "vertex", name, local)
        error_map = reliability_config.error_map(entry.get("error_map"), name, local)
        allowed = _host_list(entry.get("allow_metadata_hosts"), join(name, "allow_metadata_hosts"), local)
        reliability_config.health(entry.get("health"), name, local)
        if len(local.errors) == before:
            catalog[name] = {
                "protocol": protocol,
                "base_url": entry["base_url"],
                "error_map": error_map,
                "path": paths.get("path"),
                "path_base": paths.get("path_base"),
                "auth": auth,
                "token_url": entry.get("token_url"),
                "scope": entry.get("scope"),
                "subject": entry.get("subject"),
                "allow_metadata_hosts": allowed if "allow_metadata_hosts" in entry else None,
                "region": region,
                "azure": azure,
                "vertex": vertex,
                "health": entry.get("health"),
            }
    _scrub(local, text, env)
    out.errors.extend(f"{path}: {problem}" for problem in local.errors)
    out.warnings.extend(f"{path}: {problem}" for problem in local.warnings)
    return catalog


def _provider(
    name: object,
    entry: object,
    catalog: dict[str, dict],
    policy: HostPolicy,
    env: Mapping[str, str],
    base_dir: str,
    out: Problems,
    health_defaults=None,
) -> Provider | None:
    if not isinstance(name, str):
        out.error("providers", f"provider names must be strings, got {describe(name)}")
        return None
    path = join("providers", name)
    if name in RESERVED_PROVIDER_NAMES or name.startswith("admin/"):
        out.error(path, f"the name '{name}' is reserved")
        return None
    if not _PROVIDER_NAME.match(name):
        out.error(path, "provider names are letters, digits, '.', '_' and '-'")
        return None
    if entry is None:
        entry = {}  # `ollama:` alone: a keyless catalog provider
    if not isinstance(entry, dict):
        out.error(path, f"expected a mapping (at least api_key), got {describe(entry)}")
        return None
    errors_before = len(out.errors)
    check_keys(entry, path, PROVIDER_KEYS, out, PROVIDER_UNSUPPORTED)

    base: dict = {}
    catalog_name = get_str(entry, "catalog", path, out)
    if catalog_name is not None:
        if catalog_name not in catalog:
            out.error(
                join(path, "catalog"),
                f"no catalog provider '{catalog_name}'{suggest(catalog_name, catalog)}",
            )
            return None
        base = catalog[catalog_name]
    elif name in catalog:
        base = catalog[name]

    protocol = get_str(entry, "protocol", path, out, base.get("protocol"))
    if protocol is None:
        if "protocol" not in entry:
            hint = suggest(name, catalog)
            out.error(
                path,
                "missing required key 'protocol' (not a catalog provider"
                + (f"; {hint.strip(' ()')}" if hint else "")
                + ")",
            )
    elif protocol not in PROTOCOLS:
        out.error(join(path, "protocol"), f"unknown protocol '{protocol}'{suggest(protocol, PROTOCOLS)}")
        protocol = None

    # The provider's own allow list replaces the catalog entry's.
    if "allow_metadata_hosts" in entry or base.get("allow_metadata_hosts") is None:
        allowed = _host_list(entry.get("allow_metadata_hosts"), join(path, "allow_metadata_hosts"), out)
    else:
        allowed = base["allow_metadata_hosts"]
    host_policy = policy.with_allowed(allowed)
    azure = _azure(entry, base, path, protocol, out)
    vertex = _vertex(entry, base, path, protocol, out)
    request_path, path_base = _catalog_merge_paths(entry, base, path, azure, vertex, protocol, out)
    profile, role_arn = _aws_source(entry, path, protocol, out)
    oauth = (entry.get("auth") or base.get("auth")) in CATALOG_FOREIGN_AUTH
    service_account, token_url = _gcp_source(entry, path, env, base_dir, host_policy, out, oauth)
    if service_account is not None and vertex is None and path_base is None and \
            protocol is not None:
        out.error(join(path, "credentials"), "service-account credentials are for Vertex AI; add "
                  "vertex: {project, location} (or its path_base)")
    raw_url = entry.get("base_url", base.get("base_url"))
    if protocol in AWS_PROTOCOLS and "base_url" not in entry and isinstance(entry.get("region"), str) \
            and isinstance(raw_url, str):
        # A catalog Bedrock entry with only `region:`: the host follows the region (the catalog's
        # host names one region only because a URL needs one).
        raw_url = _BEDROCK_REGION_IN_URL.sub(r"\g<1>" + entry["region"] + ".amazonaws.com", raw_url)
    if vertex is not None and "base_url" not in entry:
        # Vertex endpoints are per location; "global" has none in its host.
        loc = vertex[1]
        raw_url = "https://aiplatform.googleapis.com" if loc == "global" else f"https://{loc}-aiplatform.googleapis.com"
    url = None
    if raw_url is None:
        out.error(path, "missing required key 'base_url' (not a catalog provider)")
    else:
        parsed = parse_base_url(raw_url, host_policy)
        if isinstance(parsed, str):
            where = join(path, "base_url") if "base_url" in entry else f"{path} (catalog base_url)"
            out.error(where, parsed)
        elif azure is not None and parsed.host == AZURE_PLACEHOLDER_HOST:
            out.error(path, "set base_url to your Azure OpenAI resource (https://<resource>.openai.azure.com)")
        else:
            url = parsed

    api_key = None
    key_failed = False
    # Bedrock without api_key signs with botocore's credential chain: always over https, and
    # over http (a loopback test endpoint) when asked for (auth: sigv4, profile, role_arn);
    # a keyless http Bedrock is otherwise an unsigned local mock, as before.
    aws_chain = (protocol in AWS_PROTOCOLS and entry.get("api_key") is None and (
        (url is not None and url.scheme == "https") or entry.get("auth") == "sigv4"
        or profile is not None or role_arn is not None))
    if aws_chain:
        require(out, path, "the AWS credential chain (no api_key)", "botocore",
                getattr(env, "offline", False))
    # BYOK (issue 10): the caller's own provider key is forwarded; busbar holds none.
    passthrough = entry.get("upstream_credentials") == "passthrough"
    if passthrough and protocol in AWS_PROTOCOLS:
        out.error(join(path, "upstream_credentials"), "passthrough cannot forward a SigV4 "
                  "signature (it is made for busbar's host); give the provider its own credentials")
    if entry.get("api_key") is not None:
        errors = len(out.errors)
        ref = entry["api_key"]
        if (entry.get("auth") or base.get("auth")) == "jwt-bearer" and isinstance(ref, dict) \
                and len(ref) == 1 and next(iter(ref)) in ("env", "file") \
                and not getattr(env, "offline", False):
            # a service account's JSON key: a file of several lines, as Google writes it
            api_key = _read_json_secret(ref, join(path, "api_key"), env, base_dir, out)
        else:
            api_key = resolve_secret(ref, join(path, "api_key"), env, base_dir, out)
        key_failed = len(out.errors) > errors
        if profile is not None or service_account is not None:
            out.error(join(path, "api_key"), "give either api_key or "
                      + ("profile" if profile is not None else "credentials") + ", not both")
    elif (url is not None and url.scheme != "http" and not aws_chain and service_account is None
          and not passthrough):
        out.error(path, "missing required key 'api_key' (only http:// loopback or private providers may omit it)")
        key_failed = True
    has_key = (api_key is not None or key_failed or aws_chain or service_account is not None
               or passthrough)

    auth = get_str(entry, "auth", path, out)
    if auth is not None:
        if auth not in AUTH_MODES + CATALOG_FOREIGN_AUTH:
            out.error(join(path, "auth"), f"unknown auth '{auth}'"
                      f"{suggest(auth, AUTH_MODES + CATALOG_FOREIGN_AUTH)}")
        elif auth == "none" and has_key:
            out.error(join(path, "auth"), "auth 'none' sends no key; remove api_key or pick another auth")
        elif auth != "none" and not has_key:
            out.error(join(path, "auth"), f"auth '{auth}' needs an api_key")
        elif auth == "oauth2" and service_account is None:
            out.error(join(path, "auth"), "auth 'oauth2' needs credentials: {file: SERVICE_ACCOUNT_JSON}")
    elif not has_key:
        auth = "none"
    elif service_account is not None:
        auth = "oauth2"
    elif aws_chain:
        auth = "sigv4"
    elif azure is not None:
        auth = "api-key"
    else:
        auth = base.get("auth") or (DEFAULT_AUTH.get(protocol, "bearer") if protocol else "bearer")
    oauth_scope = oauth_subject = None
    if auth in CATALOG_FOREIGN_AUTH:
        grant = _oauth_grant(auth, entry, base, api_key, key_failed, path, env, base_dir,
                             host_policy, out)
        if grant is None:
            auth = None
        elif auth == "jwt-bearer":
            # busbar's oauth2: the service account signs, its token refreshes off the request path
            auth, api_key = "oauth2", None
            service_account, token_url, oauth_scope, oauth_subject = grant
        else:
            token_url, oauth_scope = grant
    else:
        for key in ("scope", "subject"):
            if entry.get(key) is not None:
                out.warn(join(path, key), "has no effect with auth %s (it is for auth: %s)" % (
                    auth, "oauth-client-credentials" if key == "scope" else "jwt-bearer"))
    if auth == "sigv4" and protocol not in (None,) + AWS_PROTOCOLS:
        out.error(join(path, "auth"), "sigv4 signing is only for protocol bedrock")
    if auth == "sigv4" and api_key is not None and api_key:
        parts = api_key.split(":")
        if len(parts) not in (2, 3) or not all(parts):
            out.error(
                join(path, "api_key"),
                "a sigv4 key is ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]",
            )

    region = get_str(entry, "region", path, out, base.get("region"))
    if region is not None and not _REGION.match(region):
        out.error(join(path, "region"), "expected an AWS region such as us-east-1")
        region = None
    if protocol in AWS_PROTOCOLS and url is not None:
        match = _BEDROCK_HOST.match(url.host)
        host_region = match.group(1) if match else None
        if region is not None and host_region is not None and region != host_region:
            out.error(
                join(path, "region"),
                f"'{region}' does not match the base_url host's region '{host_region}'",
            )
        region = region or host_region
        if region is None and auth == "sigv4":
            out.error(path, "cannot derive the AWS region from base_url; set region:")
    elif protocol is not None and "region" in entry and entry["region"] is not None:
        out.error(join(path, "region"), "region applies only to protocol bedrock")
        region = None

    headers = _headers(entry.get("headers"), join(path, "headers"), env, base_dir, out)
    # reliability: the catalog's health mapping, then the provider's own keys over it.
    health_doc = entry.get("health")
    if isinstance(base.get("health"), dict) and (health_doc is None or isinstance(health_doc, dict)):
        health_doc = {**base["health"], **(health_doc or {})}
    health = reliability_config.health(
        health_doc, path, out, health_defaults or reliability_config.DEFAULT_HEALTH, passthrough)

    if len(out.errors) > errors_before or url is None or protocol is None or auth is None:
        return None
    return Provider(
        name=name,
        protocol=protocol,
        base_url=url.base_url,
        scheme=url.scheme,
        host=url.host,
        port=url.port,
        path_prefix=url.path_prefix,
        api_key=api_key,
        auth=auth,
        region=region if protocol in AWS_PROTOCOLS else None,
        headers=headers,
        profile=profile,
        role_arn=role_arn,
        gcp_service_account=service_account,
        token_url=token_url,
        oauth_scope=oauth_scope,
        oauth_subject=oauth_subject,
        vertex_project=vertex[0] if vertex else None,
        vertex_location=vertex[1] if vertex else None,
        azure=azure is not None,
        azure_deployment=azure[0] if azure else None,
        azure_api_version=azure[1] if azure else None,
        # the catalog's error_map, the provider's own codes over it
        error_map=tuple({**dict(base.get("error_map") or ()),
                         **dict(reliability_config.error_map(entry.get("error_map"), path, out))}
                        .items()),
        path=request_path,
        path_base=path_base,
        upstream_credentials=reliability_config.credentials(entry, path, out),
        health=health,
    )


def _catalog_merge_paths(entry: dict, base: dict, path: str, azure, vertex, protocol, out: Problems):
    """(path, path_base) of a provider: each its own, else its catalog entry's. `path` replaces the
    protocol's request path; `path_base` the base of a URL-model protocol's (gemini's
    /v1beta/models; anthropic's becomes Vertex AI's rawPredict form under it)."""
    if "path" in entry:
        request_path = _request_path(entry["path"], join(path, "path"), out)
        where = join(path, "path")
    else:
        request_path = base.get("path")
        where = f"{path} (catalog path)"
    if "path_base" in entry:
        path_base = _request_path(entry["path_base"], join(path, "path_base"), out)
        base_where = join(path, "path_base")
    else:
        path_base = base.get("path_base")
        base_where = f"{path} (catalog path_base)"
    if request_path is not None and (azure is not None or vertex is not None):
        out.error(where, "a path replaces the " + ("Azure OpenAI" if azure is not None else "Vertex AI")
                  + " URL scheme; give either path or " + ("azure:" if azure is not None else "vertex:"))
        request_path = None
    if path_base is not None:
        if vertex is not None or request_path is not None:
            out.error(base_where, "give either path_base or " + (
                "vertex: (both say where Vertex AI's paths go)" if vertex is not None else
                "path (a whole path, model included)"))
            path_base = None
        elif protocol is not None and codec(protocol).VERTEX_PUBLISHER is None:
            # The Rust gateway reads it for those protocols only and ignores it elsewhere.
            out.warn(base_where, f"has no effect on protocol {protocol} (it is the base of a "
                     "gemini or anthropic path with the model in it); use path")
            path_base = None
    return request_path, path_base


def _azure(entry: dict, base: dict, path: str, protocol: str | None, out: Problems):
    """(deployment, api_version) for an Azure OpenAI provider, else None. The catalog's `azure:`
    mapping is the default the provider's own mapping overrides."""
    own = get_mapping(entry, "azure", path, out)
    if own is None and base.get("azure") is None:
        return None
    where = join(path, "azure")
    merged = dict(base.get("azure") or {})
    if own is not None:
        check_keys(own, where, AZURE_KEYS, out)
        merged.update(own)
    if protocol is not None and not codec(protocol).AZURE_FORMS:
        out.error(where, "azure applies only to protocol openai or responses")
        return None
    if isinstance(merged.get("api_version"), datetime.date):
        # YAML reads an unquoted 2024-10-21 as a date; Azure's versions are exactly that shape.
        merged["api_version"] = merged["api_version"].isoformat()
    deployment = get_str(merged, "deployment", where, out)
    version = get_str(merged, "api_version", where, out)
    for key, value in (("deployment", deployment), ("api_version", version)):
        if value is not None and not _AZURE_SEGMENT.match(value):
            out.error(join(where, key), "expected letters, digits, '.', '_' or '-'")
            return None
    if deployment is not None and version is None:
        # The deployments API has no default version; this is Azure's latest GA data-plane one.
        version = AZURE_DEFAULT_API_VERSION
    if deployment is not None and protocol is not None and "deployments" not in codec(protocol).AZURE_FORMS:
        out.error(join(where, "deployment"), "the Responses API is served on Azure's v1 path only; remove deployment")
        return None
    return deployment, version


# Azure OpenAI's latest GA data-plane API version for the /deployments/ paths
# (learn.microsoft.com "Azure OpenAI in Azure AI Foundry Models REST API reference").
AZURE_DEFAULT_API_VERSION = "2024-10-21"


def _vertex(entry: dict, base: dict, path: str, protocol: str | None, out: Problems):
    """(project, location) for a Vertex AI provider, else None."""
    own = get_mapping(entry, "vertex", path, out)
    if own is None:
        if base.get("vertex") is not None:
            out.error(path, "a Vertex AI provider needs vertex: {project: P, location: L}")
        return None
    where = join(path, "vertex")
    check_keys(own, where, VERTEX_KEYS, out)
    if protocol is not None and codec(protocol).VERTEX_PUBLISHER is None:
        # the codecs with a Vertex AI publisher: gemini (google) and anthropic
        out.error(where, "vertex applies only to protocol gemini or anthropic")
        return None
    project = get_str(own, "project", where, out)
    location = get_str(own, "location", where, out)
    ok = True
    if project is None:
        out.error(where, "missing required key 'project'")
        ok = False
    elif not _GCP_PROJECT.match(project):
        out.error(join(where, "project"), "expected a GCP project id")
        ok = False
    if location is None:
        out.error(where, "missing required key 'location'")
        ok = False
    elif not _GCP_LOCATION.match(location):
        out.error(join(where, "location"), "expected a location such as us-central1 or global")
        ok = False
    return (project, location) if ok else None


def _aws_source(entry: dict, path: str, protocol: str | None, out: Problems):
    """(profile, role_arn): where an AWS provider without api_key gets its credentials."""
    profile = get_str(entry, "profile", path, out)
    role_arn = get_str(entry, "role_arn", path, out)
    if protocol is not None and protocol not in AWS_PROTOCOLS:
        for key, value in (("profile", profile), ("role_arn", role_arn)):
            if value is not None:
                out.error(join(path, key), "applies only to protocol bedrock or bedrock-invoke")
        return None, None
    if profile is not None and not _PROFILE.match(profile):
        out.error(join(path, "profile"), "expected a profile name from ~/.aws/config")
        profile = None
    if role_arn is not None and not _ROLE_ARN.match(role_arn):
        out.error(join(path, "role_arn"), "expected an IAM role ARN such as arn:aws:iam::123456789012:role/name")
        role_arn = None
    return profile, role_arn


def _oauth_grant(auth: str, entry: dict, base: dict, api_key, key_failed: bool, path: str,
                 env: Mapping[str, str], base_dir: str, policy: HostPolicy, out: Problems):
    """The Rust grammar's OAuth auth styles, checked where they are configured (so a broken key
    fails `busbar --validate`, not a request): for `jwt-bearer` (service-account JSON text, token
    URL, scope, subject), the account in api_key as its JSON or the path of its key file, its
    token_uri the token URL unless token_url is given, scope cloud-platform unless given; for
    `oauth-client-credentials` (token URL, scope), api_key CLIENT_ID:CLIENT_SECRET, token_url
    and scope required. A token URL passes the SSRF guard (https unless loopback or private, no
    metadata host). None when something is wrong (reported)."""
    where_auth = join(path, "auth") if "auth" in entry else f"{path} (catalog auth)"
    scope = get_str(entry, "scope", path, out, base.get("scope"))
    subject = get_str(entry, "subject", path, out, base.get("subject"))
    raw_url = get_str(entry, "token_url", path, out, base.get("token_url"))
    url_where = join(path, "token_url") if "token_url" in entry else f"{path} (catalog token_url)"
    offline = getattr(env, "offline", False)
    if key_failed:
        return None
    if api_key is None or not api_key.strip():
        out.error(where_auth, f"auth '{auth}' needs api_key: " + (
            "the service account's JSON key, or the path of its file" if auth == "jwt-bearer"
            else "CLIENT_ID:CLIENT_SECRET"))
        return None
    token_url = None
    if raw_url is not None:
        parsed = parse_base_url(raw_url, policy)
        if isinstance(parsed, str):
            out.error(url_where, parsed)
            return None
        token_url = parsed.base_url
    if auth == "oauth-client-credentials":
        client_id, _, secret = api_key.partition(":")
        if not client_id or not secret:
            out.error(join(path, "api_key"), "auth 'oauth-client-credentials' takes "
                      "CLIENT_ID:CLIENT_SECRET (neither empty)")
            return None
        if token_url is None:
            out.error(where_auth, "auth 'oauth-client-credentials' needs token_url (where the "
                      "client credentials are traded for a bearer)")
            return None
        if scope is None:
            out.error(where_auth, "auth 'oauth-client-credentials' needs scope")
            return None
        return token_url, scope
    if offline:
        return OFFLINE_PLACEHOLDER, token_url or "https://oauth2.googleapis.com/token", \
            scope, subject
    text = api_key
    if not text.lstrip().startswith("{"):
        # the Rust gateway's other form: the path of the key file
        file_path = os.path.join(base_dir, os.path.expanduser(text.strip()))
        try:
            with open(file_path, "rb") as fh:
                raw = fh.read(65536 + 1)
            if len(raw) > 65536:
                raise ValueError("larger than 64 KiB")
            text = raw.decode("utf-8")
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            out.error(join(path, "api_key"), "auth 'jwt-bearer': the api_key is neither a "
                      f"service account's JSON key nor a readable key file ({reason})")
            return None
    if not require(out, join(path, "api_key"), "auth 'jwt-bearer' (RS256 signing)",
                   "cryptography"):
        return None
    from busbar.upstream.gcp_oauth import CLOUD_PLATFORM, ServiceAccountError, \
        parse_service_account
    try:
        info = parse_service_account(text)
    except ServiceAccountError as exc:
        out.error(join(path, "api_key"), str(exc).replace("the credentials file",
                                                          "the service-account key"))
        return None
    if token_url is None:
        parsed = parse_base_url(info.token_uri, policy)
        if isinstance(parsed, str):
            out.error(f"{join(path, 'api_key')} (token_uri)", parsed)
            return None
        token_url = parsed.base_url
    return text, token_url, scope or CLOUD_PLATFORM, subject


def _gcp_source(entry: dict, path: str, env: Mapping[str, str], base_dir: str,
                policy: HostPolicy, out: Problems, oauth: bool = False):
    """(service-account JSON text, token URL): checked here (JSON shape, the key parses, the
    token URL passes the SSRF guard) so a broken file fails `busbar validate`, not a request.
    `oauth`: the provider's auth is one of the Rust grammar's OAuth styles, whose token_url
    _oauth_grant reads."""
    raw = entry.get("credentials")
    raw_token_url = entry.get("token_url")
    if raw is None:
        if raw_token_url is not None and not oauth:
            out.error(join(path, "token_url"), "token_url needs credentials: {file: SERVICE_ACCOUNT_JSON}")
        return None, None
    where = join(path, "credentials")
    if getattr(env, "offline", False) and isinstance(raw, dict) and len(raw) == 1 \
            and next(iter(raw)) in ("env", "file"):
        # validate --offline: the reference's shape only (the key file is not in CI).
        return OFFLINE_PLACEHOLDER, raw_token_url or "https://oauth2.googleapis.com/token"
    text = _read_json_secret(raw, where, env, base_dir, out)
    if text is None:
        return None, None
    if not require(out, where, "service-account credentials (RS256 signing)", "cryptography"):
        return None, None
    from busbar.upstream.gcp_oauth import ServiceAccountError, parse_service_account
    try:
        info = parse_service_account(text)
    except ServiceAccountError as exc:
        out.error(where, str(exc))
        return None, None
    token_url = raw_token_url if raw_token_url is not None else info.token_uri
    parsed = parse_base_url(token_url, policy)
    if isinstance(parsed, str):
        out.error(join(path, "token_url") if raw_token_url is not None else f"{where} (token_uri)", parsed)
        return None, None
    return text, parsed.base_url


def _read_json_secret(value: object, where: str, env: Mapping[str, str], base_dir: str,
                      out: Problems) -> str | None:
    """A JSON document behind a secret reference: like resolve_secret, but multi-line."""
    if not isinstance(value, dict) or set(value) - {"env", "file"} or len(value) != 1:
        out.error(where, "expected {file: SERVICE_ACCOUNT_JSON} or {env: NAME}")
        return None
    kind, ref = next(iter(value.items()))
    if not isinstance(ref, str) or not ref:
        out.error(join(where, kind), f"expected a non-empty string, got {describe(ref)}")
        return None
    if kind == "env":
        text = env.get(ref)
        if text is None:
            out.error(where, f"environment variable {ref} is not set")
        return text
    file_path = os.path.join(base_dir, os.path.expanduser(ref))
    try:
        with open(file_path, "rb") as fh:
            raw = fh.read(65536 + 1)
    except OSError as exc:
        out.error(where, f"cannot read credentials file {ref}: {exc.strerror or exc}")
        return None
    if len(raw) > 65536:
        out.error(where, f"credentials file {ref} is larger than 64 KiB")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        out.error(where, f"credentials file {ref} is not UTF-8 text")
        return None


def _headers(
    value: object, path: str, env: Mapping[str, str], base_dir: str, out: Problems
) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        out.error(path, f"expected a mapping of header name -> value, got {describe(value)}")
        return ()
    headers = []
    for name, raw in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            out.error(path, f"'{name}' is not a valid header name")
            continue
        where = join(path, name)
        if name.lower() in RESERVED_HEADERS:
            out.error(where, "busbar sets this header itself (use api_key and auth for credentials)")
            continue
        if isinstance(raw, dict):
            # A header may carry a credential (a proxy key), so it takes a secret reference too.
            resolved = resolve_secret(raw, where, env, base_dir, out)
            if resolved is not None:
                headers.append((name, resolved))
        elif isinstance(raw, str):
            if has_control(raw):
                out.error(where, "must not contain control characters")
            else:
                headers.append((name, raw))
        else:
            out.error(where, f"expected a string or a secret reference, got {describe(raw)}")
    return tuple(headers)


def _target_name(name: object, section: str, reserved: tuple[str, ...], out: Problems) -> str | None:
    if not isinstance(name, str):
        out.error(section, f"names must be strings, got {describe(name)}")
        return None
    if name in reserved:
        out.error(join(section, name), f"the name '{name}' is reserved")
        return None
    if not _TARGET_NAME.match(name):
        out.error(join(section, name), "names must be non-empty and without whitespace")
        return None
    return name


def _model(
    name: object, entry: object, providers: dict[str, Provider], providers_doc: dict, out: Problems
) -> Model | None:
    if _target_name(name, "models", RESERVED_MODEL_NAMES, out) is None:
        return None
    path = join("models", name)
    if not isinstance(entry, dict):
        out.error(path, f"expected a mapping with at least 'provider', got {describe(entry)}")
        return None
    errors_before = len(out.errors)
    check_keys(entry, path, MODEL_KEYS, out, MODEL_UNSUPPORTED)
    provider = None
    provider_name = get_str(entry, "provider", path, out)
    if provider_name is None:
        if "provider" not in entry:
            out.error(path, "missing required key 'provider'")
    elif provider_name in providers:
        provider = providers[provider_name]
    elif provider_name not in providers_doc:
        out.error(
            join(path, "provider"),
            f"unknown provider '{provider_name}'{suggest(provider_name, providers_doc)}",
        )
    # else: the provider is declared but invalid, and already reported.
    upstream_model = get_str(entry, "upstream_model", path, out, name)
    max_concurrent = get_int(entry, "max_concurrent", path, out, 1)
    default_max_tokens = get_int(entry, "default_max_tokens", path, out, 1)
    reasoning = get_bool(entry, "reasoning", path, out, False)
    prompt_caching = get_bool(entry, "prompt_caching", path, out, False)
    attempt_timeout_ms = get_int(entry, "attempt_timeout_ms", path, out, 1)
    # The Rust default is -1: any negative value means unlimited; 0 would refuse every request.
    max_requests = get_int(entry, "max_requests", path, out, -(2 ** 63))
    if max_requests == 0:
        out.error(join(path, "max_requests"), "0 would refuse every request; a negative value "
                  "(the default, -1) means unlimited")
    elif max_requests is not None and max_requests < 0:
        max_requests = None
    operations = _operations(entry, path, upstream_model, out)
    if provider is None or len(out.errors) > errors_before:
        return None
    return Model(
        name=name,
        provider=provider,
        upstream_model=upstream_model,
        max_concurrent=max_concurrent,
        default_max_tokens=default_max_tokens,
        reasoning=reasoning,
        prompt_caching=bool(prompt_caching),
        attempt_timeout_ms=attempt_timeout_ms,
        operations=operations,
        max_requests=max_requests,
    )


def _operations(entry: dict, path: str, upstream_model: object, out: Problems) -> tuple[str, ...]:
    raw = entry.get("operations")
    if raw is None:
        named = isinstance(upstream_model, str) and _EMBED_NAME.search(upstream_model)
        return ("embeddings",) if named else ("chat",)
    where = join(path, "operations")
    if not isinstance(raw, list) or not raw:
        out.error(where, f"expected a non-empty list such as [chat] or [embeddings], got {describe(raw)}")
        return ("chat",)
    ops = []
    for i, op in enumerate(raw):
        if op not in OPERATIONS:
            out.error(f"{where}[{i}]", f"unknown operation {op!r}{suggest(str(op), OPERATIONS)}"
                      if isinstance(op, str) else f"expected a string, got {describe(op)}")
        elif op not in ops:
            ops.append(op)
    return tuple(ops) or ("chat",)


def _pool_hooks(raw: object, where: str, out: Problems) -> tuple[str, ...]:
    """A `hooks:` list of bare names: at most one ordering strategy; any other name is a hook
    definition (`hooks:` at the top level, checked by busbar/hooks/config.py check_refs)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        out.error(where, f"expected a list of names such as [cheapest], got {describe(raw)}")
        return ()
    names = []
    for i, h in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(h, str) or not h:
            out.error(at, "expected the bare name of a strategy or a hook (an inline hook is the "
                      "1.x form: busbar --migrate-config lifts it into hooks:)")
        elif h not in names:
            names.append(h)
    if len([h for h in names if h in STRATEGIES]) > 1:
        out.error(where, "at most one ordering strategy per pool")
    return tuple(names)


def _upstream_credentials(entry: dict, where: str, out: Problems, default: str) -> str:
    raw = entry.get("upstream_credentials")
    if raw is None:
        return default
    if raw not in UPSTREAM_CREDENTIALS:
        out.error(join(where, "upstream_credentials"),
                  f"expected one of {', '.join(UPSTREAM_CREDENTIALS)}, got {describe(raw)}")
        return default
    return raw


def _inert_keys(section_creds: str, pools: dict[str, Pool], providers: dict[str, Provider],
                out: Problems) -> None:
    """With `pools.upstream_credentials: passthrough` (the default of every pool and of a model
    named directly), a provider's own api_key that no `own` pool sends is never used for a
    request (only for its health probes): said, as the Rust gateway warns of it."""
    if section_creds != "passthrough":
        return
    sent = {m.model.provider.name for p in pools.values() if p.upstream_credentials == "own"
            for m in p.members}
    for name, provider in providers.items():
        if provider.api_key and name not in sent and provider.upstream_credentials == "own":
            out.warn(join(join("providers", name), "api_key"), "pools.upstream_credentials is "
                     "passthrough and no pool with upstream_credentials: own uses this provider, so "
                     "its key is never sent with a request (the caller's own key is)")


def _affinity(raw: object, where: str, out: Problems) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        out.error(where, f"expected {{mode: session, header_name?}}, got {describe(raw)}")
        return None
    check_keys(raw, where, AFFINITY_KEYS, out)
    if raw.get("mode") != "session":
        out.error(join(where, "mode"), "expected session")
        return None
    header = get_str(raw, "header_name", where, out, DEFAULT_AFFINITY_HEADER)
    if header is not None and not header:
        out.error(join(where, "header_name"), "must not be empty")
        return None
    return header.lower() if header else None


def _tags(raw: dict, where: str, out: Problems) -> tuple[str, ...]:
    tags = raw.get("tags")
    if tags is None:
        return ()
    if not isinstance(tags, list) or any(not isinstance(t, str) for t in tags):
        out.error(join(where, "tags"), f"expected a list of strings, got {describe(tags)}")
        return ()
    return tuple(tags)


def _pool(
    name: object,
    entry: object,
    models: dict[str, Model],
    models_doc: dict,
    providers_doc: dict,
    out: Problems,
    section_hooks: tuple[str, ...] = (),
    section_creds: str = "own",
    hook_defs: dict | None = None,
) -> Pool | None:
    if _target_name(name, "pools", RESERVED_POOL_NAMES, out) is None:
        return None
    path = join("pools", name)
    errors_before = len(out.errors)
    # Clients name a pool or a model in the same field, so one name must mean one thing.
    if name in models_doc:
        out.error(path, f"pool name collides with model '{name}'")
    if name in providers_doc:
        out.error(path, f"pool name collides with provider '{name}'")
    if not isinstance(entry, dict):
        out.error(path, f"expected a mapping with 'members', got {describe(entry)}")
        return None
    check_keys(entry, path, POOL_KEYS, out, POOL_UNSUPPORTED)
    raw_members = entry.get("members")
    if raw_members is None:
        out.error(path, "missing required key 'members'")
        return None
    if not isinstance(raw_members, list):
        out.error(join(path, "members"), f"expected a list, got {describe(raw_members)}")
        return None
    if not raw_members:
        out.error(join(path, "members"), "a pool needs at least one member")
        return None
    members: list[Member] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_members):
        where = f"{path}.members[{i}]"
        if not isinstance(raw, dict):
            out.error(where, f"expected a mapping with 'model', got {describe(raw)}")
            continue
        check_keys(raw, where, MEMBER_KEYS, out, MEMBER_UNSUPPORTED)
        model_name = get_str(raw, "model", where, out)
        weight = get_int(raw, "weight", where, out, 1, 1)
        reasoning = get_bool(raw, "reasoning", where, out, None)
        context_max = get_int(raw, "context_max", where, out, 1)
        member_ato = get_int(raw, "attempt_timeout_ms", where, out, 1)
        tier = raw.get("tier")
        if tier is not None and not isinstance(tier, str):
            out.error(join(where, "tier"), f"expected a string or null, got {describe(tier)}")
        tags = _tags(raw, where, out)
        if model_name is None:
            if "model" not in raw:
                out.error(where, "missing required key 'model'")
            continue
        if model_name in seen:
            out.error(
                join(where, "model"),
                f"model '{model_name}' is already a member of this pool (raise its weight instead)",
            )
            continue
        seen.add(model_name)
        if model_name in models:
            members.append(Member(models[model_name], weight, reasoning, context_max, member_ato,
                                  tier if isinstance(tier, str) else None, tags))
        elif model_name not in models_doc:
            out.error(join(where, "model"), f"unknown model '{model_name}'{suggest(model_name, models_doc)}")
    if len(out.errors) > errors_before:
        return None
    protocols = sorted({m.model.provider.protocol for m in members})
    if len(protocols) > 1:
        out.warn(
            path,
            f"members speak different protocols ({', '.join(protocols)}); "
            "requests are translated per lane",
        )
    own = _pool_hooks(entry.get("hooks"), join(path, "hooks"), out)
    hooks_config.check_refs(own, join(path, "hooks"), hook_defs or {}, out, own=True)
    hooks = tuple(dict.fromkeys(section_hooks + own))     # the section's first, deduplicated
    # The pool's own strategy, else the section's, else weighted.
    strategies = [h for h in own if h in STRATEGIES] or [h for h in section_hooks if h in STRATEGIES]
    strategy = strategies[0] if strategies else "weighted"
    affinity = _affinity(entry.get("affinity"), join(path, "affinity"), out)
    # A scalar: the pool's own value replaces the all-pools default outright.
    creds = _upstream_credentials(entry, path, out, section_creds)
    # reliability (SPEC §4.2, §4.3)
    failover = reliability_config.failover(get_mapping(entry, "failover", path, out), path, sorted(seen), out)
    return Pool(name, tuple(members),
                breaker=reliability_config.breaker(get_mapping(entry, "breaker", path, out), path, out),
                failover=failover,
                on_exhausted=reliability_config.on_exhausted(entry.get("on_exhausted"), path,
                                                             failover.timeout_secs, out),
                hooks=hooks, strategy=strategy, affinity_header=affinity,
                upstream_credentials=creds)


def _limits(section: dict | None, out: Problems) -> Limits:
    if section is None:
        return Limits()
    known = tuple(LIMIT_INT_FLOORS) + LIMIT_SECONDS + ("reasoning_effort_budgets",) + \
        LIMITS_SELF_SERVICE
    check_keys(section, "limits", known, out, LIMITS_UNSUPPORTED)
    for key in LIMITS_SELF_SERVICE:
        get_int(section, key, "limits", out, 0)
    defaults = Limits()
    values = {"reasoning_effort_budgets":
              _reasoning_budgets(section.get("reasoning_effort_budgets"), out)}
    for key, floor in LIMIT_INT_FLOORS.items():
        values[key] = get_int(section, key, "limits", out, floor, getattr(defaults, key))
    for key in LIMIT_SECONDS:
        values[key] = get_seconds(section, key, "limits", out, getattr(defaults, key))
    return Limits(**values)


def _reasoning_budgets(raw, out: Problems) -> tuple:
    """(minimal, low, medium, high): the configured words over the defaults; ascending (equal
    neighbours allowed, as the Rust check), each > 0."""
    defaults = tuple(REASONING_EFFORT_BUDGETS.values())
    if raw is None:
        return defaults
    where = "limits.reasoning_effort_budgets"
    if not isinstance(raw, dict):
        out.error(where, f"expected a mapping of effort: tokens, got {describe(raw)}")
        return defaults
    check_keys(raw, where, tuple(REASONING_EFFORT_BUDGETS), out)
    merged = dict(REASONING_EFFORT_BUDGETS)
    for k, v in raw.items():
        if k in merged:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                out.error(join(where, k), f"expected a positive integer, got {describe(v)}")
                return defaults
            merged[k] = v
    values = [merged[k] for k in REASONING_EFFORT_BUDGETS]
    if values != sorted(values):
        out.error(where, "budgets must ascend from minimal to high (minimal <= low <= medium <= "
                  "high), got %s" % "/".join(str(v) for v in values))
        return defaults
    return tuple(values)


def _plugins(section: dict | None, out: Problems) -> None:
    if section is None:
        return
    check_keys(section, "plugins", PLUGINS_KEYS, out)
    if get_bool(section, "enabled", "plugins", out, False):
        out.warn("plugins.enabled", "busbar loads no plugins: its stores (memory, sqlite, valkey), "
                 "identity providers (keys, admin-tokens) and secret modules (env, file) are built in")
    if section.get("fetch"):
        out.warn("plugins.fetch", "busbar fetches no plugins; the entries are not downloaded")


def _routing(section: dict | None, out: Problems) -> None:
    if section is not None:
        check_keys(section, "routing", ROUTING_KEYS, out)
        get_int(section, "default_policy_timeout_ms", "routing", out, 1)


def _hook_timeout(doc: dict) -> int:
    """`routing.default_policy_timeout_ms`: a gate's deadline when its hook names none (the Rust
    default, 1 ms: raise it for a sidecar, which a gate reaches over HTTP). A wrong value is
    reported by `_routing`; here it reads as the default."""
    r = doc.get("routing")
    v = r.get("default_policy_timeout_ms") if isinstance(r, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1


def _public_url(doc: dict, policy: HostPolicy, out: Problems) -> None:
    """`public_url`: the gateway's address as the outside sees it, `http(s)://host[:port]` and
    nothing after it; https unless the host is loopback or private, never a metadata host."""
    raw = doc.get("public_url")
    if raw is None:
        return
    from urllib.parse import urlsplit
    try:
        u = urlsplit(raw) if isinstance(raw, str) else None
        if u is not None:
            _ = u.port      # reading it raises ValueError for a port outside 0-65535
    except ValueError:
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") \
            or u.query or u.fragment or u.username or u.password:
        out.error("public_url", "expected an absolute http(s)://host[:port] with nothing after it")
        return
    # The same checks as a provider's base_url (metadata hosts refused; plain http only to a
    # loopback or private address).
    checked = parse_base_url("%s://%s" % (u.scheme, u.netloc), policy)
    if isinstance(checked, str):
        out.error("public_url", checked)


def _advanced(section: dict | None, out: Problems) -> tuple[int | None, bool]:
    if section is None:
        return None, False
    check_keys(section, "advanced", ADVANCED_KEYS, out, ADVANCED_UNSUPPORTED)
    # The Rust gateway's sweep of expired rate windows; busbar's windows roll by their id and
    # need no sweep, so the value is checked and has no effect.
    get_int(section, "rate_sweep_interval", "advanced", out, 1)
    get_bool(section, "upstream_http1_only", "advanced", out, False)   # busbar speaks HTTP/1.1
    if get_bool(section, "upstream_h2_prior_knowledge", "advanced", out, False):
        out.error("advanced.upstream_h2_prior_knowledge", "busbar speaks HTTP/1.1 to upstreams; "
                  "HTTP/2 is not supported by this busbar version")
    workers = get_int(section, "worker_threads", "advanced", out, 1)
    server_timing = False
    headers = get_mapping(section, "response_headers", "advanced", out)
    if headers is not None:
        check_keys(
            headers, "advanced.response_headers", RESPONSE_HEADERS_KEYS, out,
            RESPONSE_HEADERS_UNSUPPORTED,
        )
        server_timing = bool(get_bool(headers, "server_timing", "advanced.response_headers", out, False))
    return workers, server_timing
