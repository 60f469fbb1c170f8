"""The control-plane sections of a config: `admin_listen`, `admin_tls`, `admin_require_mtls`,
`tls`, `auth.admin_auth` with the `identity-providers` it names (the operator's admin tokens) and
`config` (overlay, locked). SPEC §2.4, §6, §8.

Parsed here, not in loader.py, so the data plane's sections and the control plane's stay apart.
TLS material is a secret reference resolving to PEM: kept as text (the config is sent to every
worker by pickling, and an ssl.SSLContext does not pickle); `ssl_context()` builds the context in
each process. Building it once at load time is also the check that the PEM is usable, so a bad
certificate or key fails boot naming its key path.
"""
from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Mapping

from .checks import Problems, check_keys, describe, get_bool, get_mapping, get_str, join
from .schema import REDACTED

# SPEC §6: the admin listener's default address; loopback, so a default install exposes nothing.
DEFAULT_ADMIN_LISTEN = ("127.0.0.1", 8081)
ADMIN_LISTEN_ENV = "BUSBAR_ADMIN_LISTEN"
SCOPES = ("full", "read-only")
TLS_KEYS = ("cert", "key", "client_ca")
# `chain`, `signing_key`, `role_bindings` and `key_ttl` are governance's
# (busbar/governance/config.py); `admin_auth` and the identity providers it names are parsed here.
AUTH_KEYS = ("admin_auth", "chain", "signing_key", "role_bindings", "key_ttl")
AUTH_UNSUPPORTED = ("keys",)
# `identity-providers.<name>`: a definition the chains name by bare name (the Rust 1.5.3 grammar).
IDP_KEYS = ("module", "settings", "max_admin_scope", "token", "browser_login")
# The identity-provider modules built into busbar: signed virtual keys on the data plane, and the
# operator's admin token. Any other module is a plugin busbar does not load.
IDP_MODULES = ("keys", "admin-tokens")
# With no `auth.admin_auth`, the admin plane is guarded by the built-in `admin-tokens` provider
# (which, undefined, holds no token: every admin call is then 401).
DEFAULT_ADMIN_AUTH = ("admin-tokens",)
CONFIG_KEYS = ("locked", "overlay")
# SPEC §2.4: the overlay file's default name, next to config.yaml.
DEFAULT_OVERLAY = "busbar-overlay.json"
# 64 KiB is ample for a certificate chain; bounds what a mistaken path (a log file) reads.
PEM_MAX_BYTES = 256 * 1024
# Keys a running gateway cannot change: they are bound or forked at start (SPEC §6).
RESTART_ONLY = ("listen", "admin_listen", "tls", "admin_tls", "admin_require_mtls", "store",
                "advanced.worker_threads")


@dataclass(frozen=True, slots=True)
class AdminToken:
    name: str
    token: str
    scope: str

    def __repr__(self) -> str:
        return f"AdminToken(name={self.name!r}, scope={self.scope!r}, token={REDACTED!r})"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Tls:
    """PEM text of a listener's certificate chain, key and (mTLS) client CA bundle; `where` is the
    config path, for messages."""

    where: str
    cert: str
    key: str
    client_ca: str | None = None

    def __repr__(self) -> str:
        return f"Tls({self.where}, key={REDACTED!r}, mtls={self.client_ca is not None})"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Control:
    admin_host: str = DEFAULT_ADMIN_LISTEN[0]
    admin_port: int = DEFAULT_ADMIN_LISTEN[1]
    admin_tokens: tuple[AdminToken, ...] = ()
    admin_open: bool = False
    admin_require_mtls: bool = True
    tls: Tls | None = None
    admin_tls: Tls | None = None
    locked: bool = False
    overlay: str | None = None       # absolute path of the overlay file; None: no overlay


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssl_context(tls: Tls, handshake_alpn=("http/1.1",)) -> ssl.SSLContext:
    """A server context for `tls`. Client certificates are required when a client CA is given
    (SPEC §8: mTLS required, a client without one fails the handshake). Raises ssl.SSLError or
    ValueError on unusable PEM."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(list(handshake_alpn))
    # load_cert_chain reads files only: the PEM goes through a private temporary file that is
    # removed at once (it may have come from an environment variable).
    import tempfile  # at TLS set-up only (with shutil, ~0.6 MiB a serving process need not keep)
    fd, path = tempfile.mkstemp(prefix="busbar-tls-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(tls.cert if tls.cert.endswith("\n") else tls.cert + "\n")
            fh.write(tls.key)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
    if tls.client_ca is not None:
        ctx.load_verify_locations(cadata=tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _pem(value: object, path: str, env: Mapping[str, str], base_dir: str, out: Problems,
         offline: bool) -> str | None:
    """A secret reference resolving to PEM text (newlines allowed, unlike a key)."""
    if isinstance(value, str):
        out.error(path, "expected a secret reference {file: PATH} or {env: NAME}, not inline text")
        return None
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in ("file", "env"):
        out.error(path, f"expected a secret reference {{file: PATH}} or {{env: NAME}}, got {describe(value)}")
        return None
    kind, ref = next(iter(value.items()))
    if not isinstance(ref, str) or not ref:
        out.error(join(path, kind), f"expected a non-empty string, got {describe(ref)}")
        return None
    if offline:
        return None
    if kind == "env":
        text = env.get(ref)
        if text is None:
            out.error(path, f"environment variable {ref} is not set")
            return None
    else:
        try:
            with open(os.path.join(base_dir, os.path.expanduser(ref)), "rb") as fh:
                raw = fh.read(PEM_MAX_BYTES + 1)
            text = raw.decode("ascii")
        except OSError as exc:
            out.error(path, f"cannot read {ref}: {exc.strerror or exc}")
            return None
        except UnicodeDecodeError:
            out.error(path, f"{ref} is not PEM text")
            return None
        if len(raw) > PEM_MAX_BYTES:
            out.error(path, f"{ref} is larger than {PEM_MAX_BYTES // 1024} KiB")
            return None
    if "-----BEGIN " not in text:
        out.error(path, "not PEM (no '-----BEGIN' line)")
        return None
    return text


def _tls(doc: dict, key: str, env, base_dir, out: Problems, offline: bool) -> Tls | None:
    section = get_mapping(doc, key, "", out)
    if section is None:
        return None
    check_keys(section, key, TLS_KEYS, out)
    errors = len(out.errors)
    for required in ("cert", "key"):
        if required not in section:
            out.error(key, f"missing required key '{required}'")
    values = {k: _pem(section[k], join(key, k), env, base_dir, out, offline)
              for k in TLS_KEYS if k in section}
    if len(out.errors) > errors or offline:
        return None
    tls = Tls(key, values["cert"], values["key"], values.get("client_ca"))
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        import tempfile
        fd, path = tempfile.mkstemp(prefix="busbar-tls-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(tls.cert + "\n")
            # The key separately, so a mismatch is told apart from an unreadable key.
            fdk, kpath = tempfile.mkstemp(prefix="busbar-tls-")
            try:
                with os.fdopen(fdk, "w") as fh:
                    fh.write(tls.key)
                try:
                    ctx.load_cert_chain(path, kpath)
                except ssl.SSLError as exc:
                    which = "cert" if "PEM lib" in str(exc) and "KEY" not in str(exc).upper() else "key"
                    out.error(join(key, which), f"unusable certificate or key: {exc.reason or exc}")
                    return None
            finally:
                os.unlink(kpath)
        finally:
            os.unlink(path)
        if tls.client_ca is not None:
            try:
                ctx.load_verify_locations(cadata=tls.client_ca)
            except (ssl.SSLError, ValueError) as exc:
                out.error(join(key, "client_ca"), f"unusable CA bundle: {getattr(exc, 'reason', None) or exc}")
                return None
    except ssl.SSLError as exc:
        out.error(key, f"unusable TLS material: {exc.reason or exc}")
        return None
    return tls


def _admin_token(ref, where: str, env, out: Problems) -> str | None:
    """An operator token's value, or None (reported): resolved, and never blank (SPEC §6: a blank
    admin token would let an empty header through)."""
    from .secrets import resolve_secret
    errors = len(out.errors)
    token = resolve_secret(ref, where, env, "", out)
    if len(out.errors) > errors or token is None:
        return None
    if not token:
        out.error(where, "resolves to an empty token")
        return None
    return token


def identity_providers(doc: dict, out: Problems) -> dict:
    """`identity-providers`: {name: definition mapping}, each checked for its shape (secrets are
    resolved by whoever uses the definition). A module busbar does not have is refused in one
    line that names it."""
    raw = doc.get("identity-providers")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        out.error("identity-providers", f"expected a mapping of name: definition, got {describe(raw)}")
        return {}
    defs = {}
    for name, spec in raw.items():
        where = f"identity-providers.{name}"
        if not isinstance(spec, dict):
            out.error(where, f"expected a mapping {{module, settings, ...}}, got {describe(spec)}")
            continue
        check_keys(spec, where, IDP_KEYS, out)
        module = get_str(spec, "module", where, out)
        if not module:
            out.error(where, "missing required key 'module'")
            continue
        if module not in IDP_MODULES:
            out.error(join(where, "module"), f"identity-provider module '{module}' is not built into "
                      f"busbar (built in: {', '.join(IDP_MODULES)}); busbar loads no plugins")
            continue
        scope = spec.get("max_admin_scope")
        if scope is not None and scope not in SCOPES:
            out.error(join(where, "max_admin_scope"), f"expected one of {', '.join(SCOPES)}")
            continue
        if "token" in spec and module != "admin-tokens":
            out.error(join(where, "token"), "only a module: admin-tokens provider holds a token")
            continue
        if "browser_login" in spec:
            out.error(join(where, "browser_login"), f"module '{module}' has no browser login")
            continue
        defs[name] = spec
    return defs


def _admin_auth(auth: dict, idps: dict, env, out: Problems, offline: bool):
    """`auth.admin_auth`: the admin plane's providers by name -> (admin tokens, open). `[]` is an
    open admin API. Each `admin-tokens` provider with a token is one operator credential, of its
    `max_admin_scope` (full by default for this module)."""
    raw = auth.get("admin_auth", list(DEFAULT_ADMIN_AUTH))
    if not isinstance(raw, list):
        out.error("auth.admin_auth", f"expected a list of identity-provider names, got {describe(raw)}")
        return (), False
    tokens = []
    for i, name in enumerate(raw):
        where = f"auth.admin_auth[{i}]"
        if not isinstance(name, str) or not name:
            out.error(where, f"expected the bare name of an identity provider, got {describe(name)}")
            continue
        spec = idps.get(name)
        if spec is None:
            if name in IDP_MODULES:     # a built-in named bare: admin-tokens without a token
                continue
            out.error(where, f"'{name}' is not defined under identity-providers (built in: "
                      f"{', '.join(IDP_MODULES)})")
            continue
        if spec.get("module") != "admin-tokens":
            out.error(where, f"'{name}' (module {spec.get('module')}) cannot authenticate operators")
            continue
        if "token" not in spec or offline:
            continue
        token = _admin_token(spec["token"], f"identity-providers.{name}.token", env, out)
        if token is not None:
            tokens.append(AdminToken(name, token, spec.get("max_admin_scope") or "full"))
    return tuple(tokens), raw == []


def parse_control(doc: dict, base_dir: str, env: Mapping[str, str], out: Problems,
                  listen_of, offline: bool = False) -> Control:
    """The control sections of `doc`. `listen_of(value, key)` parses a HOST:PORT like `listen:`."""
    admin_host, admin_port = DEFAULT_ADMIN_LISTEN
    if doc.get("admin_listen") is not None:
        admin_host, admin_port = listen_of(doc["admin_listen"], "admin_listen")
    elif ADMIN_LISTEN_ENV in env and env[ADMIN_LISTEN_ENV]:
        # Several gateways on one host (tests, a laptop) would all want 8081: the environment can
        # move the default, as BUSBAR_CONFIG moves the config file's.
        admin_host, admin_port = listen_of(env[ADMIN_LISTEN_ENV], ADMIN_LISTEN_ENV)
    require_mtls = get_bool(doc, "admin_require_mtls", "", out, True)
    tls = _tls(doc, "tls", env, base_dir, out, offline)
    admin_tls = _tls(doc, "admin_tls", env, base_dir, out, offline)
    if (not is_loopback(admin_host) and require_mtls and not offline
            and (admin_tls is None or admin_tls.client_ca is None)):
        out.error("admin_listen", f"'{admin_host}' is not loopback: set admin_tls with a client_ca "
                  "(mTLS), or admin_require_mtls: false")

    auth = get_mapping(doc, "auth", "", out) or {}
    check_keys(auth, "auth", AUTH_KEYS, out, AUTH_UNSUPPORTED)
    idps = identity_providers(doc, out)
    tokens, admin_open = _admin_auth(auth, idps, env, out, offline)
    if admin_open:
        out.warn("auth.admin_auth", "[]: the admin API is open to anyone who reaches "
                 f"{admin_host}:{admin_port} (no token needed)")

    cfg = get_mapping(doc, "config", "", out) or {}
    check_keys(cfg, "config", CONFIG_KEYS, out)
    locked = bool(get_bool(cfg, "locked", "config", out, False))
    overlay = None
    raw = cfg.get("overlay")
    if raw is False:
        overlay = None
    elif raw is None:
        # Durable by default (the Rust 1.5.3 posture): API changes persist beside config.yaml.
        overlay = None if locked else os.path.join(base_dir, DEFAULT_OVERLAY)
    elif isinstance(raw, dict):
        check_keys(raw, "config.overlay", ("file",), out)
        f = get_str(raw, "file", "config.overlay", out)
        if f is None:
            out.error("config.overlay", "missing required key 'file'")
        else:
            overlay = os.path.join(base_dir, os.path.expanduser(f))
    else:
        out.error("config.overlay", f"expected {{file: PATH}} or false, got {describe(raw)}")
    return Control(admin_host, admin_port, tokens, admin_open, bool(require_mtls), tls, admin_tls,
                   locked, overlay)


def restart_required(old_doc: dict | None, new_doc: dict | None) -> list[str]:
    """The restart-only keys whose value differs between two config documents."""
    def get(doc, dotted):
        node = doc or {}
        for part in dotted.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node
    return [k for k in RESTART_ONLY if get(old_doc, k) != get(new_doc, k)]



def overlay_path(doc: dict, base_dir: str) -> str | None:
    """Where a mutable config persists API mutations (beside config.yaml unless `config.overlay`
    says otherwise); None when locked or `config.overlay: false`."""
    cfg = doc.get("config")
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict) or cfg.get("locked") is True:
        return None
    raw = cfg.get("overlay")
    if raw is False:
        return None
    if isinstance(raw, dict) and isinstance(raw.get("file"), str):
        return os.path.join(base_dir, os.path.expanduser(raw["file"]))
    if raw is None:
        return os.path.join(base_dir, DEFAULT_OVERLAY)
    return None


def apply_overlay(doc: dict, base_dir: str, out: Problems, drop=frozenset(),
                  groups_sink: dict | None = None) -> dict:
    """config.yaml's document with the overlay applied (SPEC §2.4: reapplied over config.yaml at
    boot), in the Rust gateway's overlay format (busbar/admin/overlay.py, which also carries an
    earlier busbar's overlay over). A missing overlay is normal; a corrupt one is ignored with a
    warning, as the reference does; one written by a newer busbar refuses boot. The overlay's
    groups are not merged (they are API groups, busbar/governance/overlay_groups.py): they go into
    `groups_sink` when one is given."""
    from busbar.admin import overlay as fmt
    path = overlay_path(doc, base_dir)
    if path is None or not os.path.exists(path):
        return doc
    try:
        ov = fmt.read(path, warn=lambda m: out.warn("config.overlay", f"{path}: {m}"))
    except fmt.OverlayTooNew as exc:
        out.error("config.overlay", f"{path} was {exc}")
        return doc
    except fmt.OverlayError as exc:
        out.warn("config.overlay", f"ignoring unreadable overlay {path}: {exc}")
        return doc
    if drop:
        ov = fmt.without(ov, drop)
    if groups_sink is not None:
        groups_sink.update(groups=ov["groups"], deleted_groups=ov["deleted_groups"])
    return fmt.apply(doc, ov)


def overlay_entries_at_fault(doc: dict, base_dir: str, errors: list) -> set | None:
    """The entries of the overlay (busbar/admin/overlay.py) that every problem of a config built
    with it is about, or None when some problem is config.yaml's own."""
    from busbar.admin import overlay as fmt
    try:
        ov = fmt.read(overlay_path(doc, base_dir))
    except fmt.OverlayError:
        return None
    return fmt.implicated(ov, errors)
