"""Problem collection and the typed field readers the loader is built from.

Every check records a problem and carries on, so one `busbar validate` run reports everything wrong
with a file instead of one fix-and-retry round per mistake. Messages carry the key's full path and
describe wrong values by type only: a misplaced secret must not be echoed back.
"""
from __future__ import annotations

import math
from typing import Iterable

_MISSING = object()


class Problems:
    """Errors make the config invalid; warnings are printed and the config still loads."""

    __slots__ = ("errors", "warnings")

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}")


def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def describe(value: object) -> str:
    """A value's YAML type, for messages ("got a string"); never the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def suggest(key: str, options: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the nearest valid name, or ""."""
    import difflib  # only for a config error: not kept in a serving process (~0.2 MiB)
    match = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_keys(
    mapping: dict,
    path: str,
    known: Iterable[str],
    out: Problems,
    unsupported: Iterable[str] = (),
) -> None:
    """Flags every key that is not `known`: reference keys busbar has not implemented yet are
    refused by name (a silently ignored key is worse than a refusal), the rest get a suggestion."""
    known = tuple(known)
    unsupported = frozenset(unsupported)
    for key in mapping:
        if not isinstance(key, str):
            out.error(path or "<top level>", f"keys must be strings, got {describe(key)}")
            continue
        if key in known:
            continue
        where = join(path, key)
        if key in unsupported:
            out.error(where, "not supported by this busbar version")
        else:
            out.error(where, f"unknown key{suggest(key, known)}")


def get_mapping(mapping: dict, key: str, path: str, out: Problems) -> dict | None:
    """An optional nested mapping; null counts as absent."""
    value = mapping.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        out.error(join(path, key), f"expected a mapping, got {describe(value)}")
        return None
    return value


def get_int(mapping: dict, key: str, path: str, out: Problems, floor: int, default=None):
    value = mapping.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        out.error(join(path, key), f"expected an integer, got {describe(value)}")
        return default
    if value < floor:
        out.error(join(path, key), f"must be >= {floor}, got {value}")
        return default
    return value


def get_seconds(mapping: dict, key: str, path: str, out: Problems, default: float) -> float:
    value = mapping.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        out.error(join(path, key), f"expected a number of seconds, got {describe(value)}")
        return default
    if not math.isfinite(value) or value <= 0:
        out.error(join(path, key), f"must be a finite number > 0, got {value}")
        return default
    return float(value)


def get_bool(mapping: dict, key: str, path: str, out: Problems, default):
    value = mapping.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, bool):
        out.error(join(path, key), f"expected true or false, got {describe(value)}")
        return default
    return value


def get_str(mapping: dict, key: str, path: str, out: Problems, default=None):
    """An optional non-empty string without control characters."""
    value = mapping.get(key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, str) or not value:
        out.error(join(path, key), f"expected a non-empty string, got {describe(value)}")
        return default
    if has_control(value):
        out.error(join(path, key), "must not contain control characters")
        return default
    return value


def has_control(text: str) -> bool:
    return any(c < " " or c == "\x7f" for c in text)


def problem_list(lines):
    """'path: message' lines → [{path, message}] (the same lines `busbar validate` prints)."""
    out = []
    for line in lines:
        path, sep, message = line.partition(": ")
        out.append({"path": path, "message": message} if sep else {"path": "", "message": line})
    return out
