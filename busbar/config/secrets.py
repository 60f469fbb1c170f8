"""Secret references: `{env: NAME}` or `{file: PATH}`, never a literal (SPEC §2.1). The Rust
grammar's canonical forms mean the same: `{module: env, settings: {key: NAME}}` and `{module: file,
settings: {path: PATH}}`; a module busbar does not have (a secret plugin) is refused in one line.

A literal in config.yaml ends up in git, backups and support tickets; a reference keeps the value in
the environment or a mounted file. Messages here name the variable or the path, never the value.
"""
from __future__ import annotations

import os
import re
from typing import Mapping

from .checks import Problems, describe, suggest

# A resolved secret goes into an HTTP header; CR/LF would let it inject headers, NUL truncates.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

SECRET_KEYS = ("env", "file")
# The canonical spelling: the built-in secret modules and the one setting each reads.
SECRET_MODULES = {"env": "key", "file": "path"}
# What an unresolved secret stands for offline: shaped like a Bedrock key pair, so format checks pass.
OFFLINE_PLACEHOLDER = "offline-placeholder:offline-placeholder"


class OfflineEnv(dict):
    """The environment for `busbar validate --offline`: secret references are not resolved, and
    an unset ${VAR} reads as a placeholder (a note is printed) instead of failing."""

    offline = True

    def __init__(self, real):
        super().__init__(real)
        self.missing = set()

    def interpolated(self, key):
        if key in self:
            return self[key]
        self.missing.add(key)
        return "offline"


def resolve_secret(
    value: object, path: str, env: Mapping[str, str], base_dir: str, out: Problems, raw: bool = False
) -> str | bytes | None:
    """The secret's value, or None after recording a problem. `path` is the config path of the
    reference (for messages); relative `file:` paths are taken from the config file's folder.
    `raw`: the bytes exactly as found (a file's whole content, a variable's value), for a secret
    that is not text (auth.signing_key may be 32 raw bytes); the caller checks them."""
    if isinstance(value, str):
        out.error(path, "inline secrets are not allowed; use {env: NAME} or {file: PATH}")
        return None
    if not isinstance(value, dict):
        out.error(path, f"expected a secret reference {{env: NAME}} or {{file: PATH}}, got {describe(value)}")
        return None
    if "module" in value:
        value = _canonical(value, path, out)
        if value is None:
            return None
    unknown = [key for key in value if key not in SECRET_KEYS]
    for key in unknown:
        out.error(f"{path}.{key}", f"unknown key{suggest(str(key), SECRET_KEYS)}")
    present = [k for k in SECRET_KEYS if k in value]
    if len(present) != 1:
        if not present and unknown:
            return None
        out.error(path, "a secret reference has exactly one of 'env' or 'file'")
        return None
    kind = present[0]
    ref = value[kind]
    if not isinstance(ref, str) or not ref:
        out.error(f"{path}.{kind}", f"expected a non-empty string, got {describe(ref)}")
        return None
    if getattr(env, "offline", False):
        # `busbar validate --offline` (CI): the reference's shape is checked, not its value.
        return OFFLINE_PLACEHOLDER
    if kind == "env":
        if not _ENV_NAME.match(ref):
            out.error(f"{path}.env", f"'{ref}' is not a valid environment variable name")
            return None
        secret = env.get(ref)
        if secret is None:
            out.error(path, f"environment variable {ref} is not set")
            return None
        if raw:
            return secret.encode("utf-8", "surrogateescape")
        where = f"environment variable {ref}"
    else:
        file_path = os.path.join(base_dir, os.path.expanduser(ref))
        try:
            with open(file_path, "rb") as fh:
                data = fh.read(65536 + 1)
        except OSError as exc:
            out.error(path, f"cannot read secret file {ref}: {exc.strerror or exc}")
            return None
        if len(data) > 65536:
            out.error(path, f"secret file {ref} is larger than 64 KiB")
            return None
        if raw:
            return data
        try:
            secret = data.decode("utf-8")
        except UnicodeDecodeError:
            out.error(path, f"secret file {ref} is not UTF-8 text")
            return None
        # Editors and `echo` end files with a newline that is not part of the key.
        secret = secret.rstrip("\r\n")
        where = f"secret file {ref}"
    if _CONTROL.search(secret):
        out.error(path, f"{where} contains control characters")
        return None
    if secret.strip() != secret:
        out.error(path, f"{where} has leading or trailing whitespace")
        return None
    if not secret:
        out.warn(path, f"{where} is empty; the lane starts but its upstream calls will fail auth")
    return secret


def _canonical(value: dict, path: str, out: Problems) -> dict | None:
    """`{module: env|file, settings: {key|path}}` as the sugar form, or None (reported)."""
    extra = [k for k in value if k not in ("module", "settings")]
    if extra:
        out.error(path, "a reference with module: takes only module and settings (not %s)"
                  % ", ".join(map(str, extra)))
        return None
    module = value.get("module")
    setting = SECRET_MODULES.get(module) if isinstance(module, str) else None
    if setting is None:
        out.error(f"{path}.module", "secret module %s is not built into busbar (built in: env, "
                  "file); busbar loads no plugins" % (
                      "'%s'" % module if isinstance(module, str) and module else describe(module)))
        return None
    settings = value.get("settings")
    if not isinstance(settings, dict) or set(settings) != {setting}:
        out.error(f"{path}.settings", f"module {module} takes settings: {{{setting}: ...}}")
        return None
    return {module: settings[setting]}


def secrets_section(raw, out: Problems) -> None:
    """`secrets.<module>: {settings}`: configuration of a secret module. busbar's two (env, file)
    take none, and it loads no other; so every entry is refused, saying why."""
    if raw is None or raw == {}:
        return
    if not isinstance(raw, dict):
        out.error("secrets", f"expected a mapping of module: {{settings}}, got {describe(raw)}")
        return
    for name in raw:
        if name in SECRET_MODULES:
            out.error(f"secrets.{name}", "the built-in env and file modules take no settings")
        else:
            out.error(f"secrets.{name}", f"secret module '{name}' is not built into busbar "
                      "(built in: env, file); busbar loads no plugins")
