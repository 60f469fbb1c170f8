"""`${VAR}` interpolation over the raw config text, before YAML parsing (SPEC §2.1).

Only the brace form exists, so a bare `$` is always literal. It runs over the whole file, comments
included, which is why an unset variable anywhere is fatal: the file must mean one thing.

A value could smuggle YAML structure into the file (`{a: 1}`, `[x]`, `key: value`), turning an
environment variable into config the author never wrote. So the text is interpolated twice, once
with the real values and once with inert placeholders, and both parses must have the same tree
shape (`same_shape`); the caller does that comparison after parsing.
"""
from __future__ import annotations

import re
from typing import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# C0 controls and DEL: a newline or tab in a value would restructure the YAML around it.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def interpolate(text: str, env: Mapping[str, str], problems: list[str]) -> tuple[str, str | None]:
    """Returns (text with real values, text with placeholders), or (text, None) when the file has
    no `${`. Problems are appended as "<${NAME}>: <message>" with the line number, never a value."""
    if "${" not in text:
        return text, None
    real: list[str] = []
    shadow: list[str] = []
    pos = 0
    n = 0
    while True:
        start = text.find("${", pos)
        if start < 0:
            break
        line = text.count("\n", 0, start) + 1
        real.append(text[pos:start])
        shadow.append(text[pos:start])
        end = text.find("}", start + 2)
        newline = text.find("\n", start + 2)
        if end < 0 or (0 <= newline < end):
            problems.append(f"line {line}: unclosed '${{' (write ${{NAME}})")
            pos = start + 2
            continue
        name = text[start + 2 : end]
        pos = end + 1
        if not name:
            problems.append(f"line {line}: empty '${{}}' names no variable")
            continue
        if not _NAME.match(name):
            problems.append(f"line {line}: '${{{name}}}' is not a valid variable name")
            continue
        # validate --offline reads unset variables as placeholders (config/secrets.py OfflineEnv).
        value = env.interpolated(name) if hasattr(env, "interpolated") else env.get(name)
        if value is None:
            problems.append(f"${{{name}}}: environment variable is not set (line {line})")
            continue
        if _CONTROL.search(value):
            problems.append(
                f"${{{name}}}: value contains control characters (line {line}); "
                "use a {file: PATH} reference for multi-line values"
            )
            continue
        real.append(value)
        # A plain word: a scalar wherever it lands, keys included, and unique per use.
        shadow.append(f"busbar_placeholder_{n}")
        n += 1
    real.append(text[pos:])
    shadow.append(text[pos:])
    return "".join(real), "".join(shadow)


def same_shape(a: object, b: object) -> bool:
    """True when two parsed YAML trees have the same structure: mappings with the same number of
    entries whose values match in order, sequences of equal length, and scalars opposite scalars.
    Keys are compared only as scalars, since a variable may legitimately form a key."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for (ka, va), (kb, vb) in zip(a.items(), b.items()):
            if isinstance(ka, (dict, list, tuple)) or isinstance(kb, (dict, list, tuple)):
                return False
            if not same_shape(va, vb):
                return False
        return True
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return False
        return all(same_shape(x, y) for x, y in zip(a, b))
    return not isinstance(b, (dict, list))
