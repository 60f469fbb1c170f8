"""A small renderer for busbar's Helm chart (packaging/helm/busbar), so that tests can render it with
no `helm` binary and no cluster, and so that the plain manifest (packaging/k8s/busbar.yaml) can be
written from it.

It implements the part of Go's text/template and of Helm that the chart uses, and refuses the rest
(an unknown function, action or syntax is an error, not a silent blank), so the chart's templates
stay within what is checked here:

- actions `{{ pipeline }}`, with `{{-` / `-}}` trimming the whitespace (newlines included) before /
  after them, and comments `{{/* ... */}}`;
- `if` / `else if` / `else` / `end`, `define "name"` / `end` (in any template; `_*.tpl` files only
  define) and `include "name" ctx`;
- pipelines `a | f x` (the previous value is passed as the last argument), parenthesised
  sub-pipelines, string literals ("..." with Go's escapes, and `...`), integer literals, true,
  false, nil, `.` and field chains such as `.Values.image.tag`;
- functions: include, toYaml, indent, nindent, quote, default, required, sha256sum, trunc,
  trimSuffix, contains, printf (%s, %v, %%), not, and, or, eq, ne.

Values follow Helm: values.yaml deep-merged with the overrides, where an override of null removes
the chart's key; a missing map key reads as nil (printed as nothing) and a field of nil is an error,
as with Helm's `nil pointer evaluating interface {}` error. Numbers print as Go prints the float64
Helm holds them in (8080 -> "8080", 1000000 -> "1e+06"), and printing a map or a list is an error
(use toYaml). Rendered manifests are split on `---` lines, parsed with duplicate keys refused, and
ordered like Helm's install order.

    python tests/packaging/helm_render.py packaging/helm/busbar                # to stdout
    python tests/packaging/helm_render.py packaging/helm/busbar --write-plain  # packaging/k8s/busbar.yaml
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "packaging", "helm", "busbar")
PLAIN = os.path.join(ROOT, "packaging", "k8s", "busbar.yaml")
# The plain manifest is the chart rendered as `helm template busbar packaging/helm/busbar` would.
PLAIN_RELEASE = "busbar"

# Helm's install order (pkg/releaseutil/kind_sorter.go), for the kinds a chart like this can have.
INSTALL_ORDER = [
    "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
    "ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList",
    "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod", "ReplicationController",
    "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService",
]


class TemplateError(Exception):
    pass


# ------------------------------------------------------------------------------------------ lexing
@dataclass
class Text:
    text: str


@dataclass
class Action:
    src: str          # the action's content, without delimiters and trim markers
    where: str        # "file:line" for messages


def lex(text: str, name: str) -> list:
    """Text and Action items, with the `{{-` / `-}}` trimming applied and comments dropped."""
    items: list = []
    pos = 0
    trim_next = False
    while True:
        start = text.find("{{", pos)
        chunk = text[pos:] if start < 0 else text[pos:start]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        if start < 0:
            items.append(Text(chunk))
            return items
        line = text.count("\n", 0, start) + 1
        where = f"{name}:{line}"
        inner = start + 2
        if text.startswith(("- ", "-\t", "-\n", "-\r"), inner):
            chunk = chunk.rstrip(" \t\r\n")
            inner += 1
        items.append(Text(chunk))
        end = _action_end(text, inner, where)
        body = text[inner:end]
        trim_next = body.endswith((" -", "\t-", "\n-", "\r-"))
        if trim_next:
            body = body[:-1]
        pos = end + 2
        stripped = body.strip()
        if stripped.startswith("/*"):
            if not stripped.endswith("*/"):
                raise TemplateError(f"{where}: unclosed comment")
            continue
        items.append(Action(stripped, where))


def _action_end(text: str, i: int, where: str) -> int:
    """Index of the `}}` closing the action that starts at i (quotes and comments skipped)."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif c == "`":
            i = text.find("`", i + 1) + 1
            if i == 0:
                break
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                break
            i = j + 2
        elif text.startswith("}}", i):
            return i
        else:
            i += 1
    raise TemplateError(f"{where}: unclosed action")


# ----------------------------------------------------------------------------------------- parsing
@dataclass
class Node:
    pass


@dataclass
class TextNode(Node):
    text: str


@dataclass
class Output(Node):
    pipe: list
    where: str


@dataclass
class If(Node):
    branches: list    # [(pipeline, [Node])]
    otherwise: list
    where: str


@dataclass
class Template:
    name: str
    body: list
    defines: dict = field(default_factory=dict)


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()|])
""", re.VERBOSE)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}


def _go_string(lit: str, where: str) -> str:
    out = []
    i, body = 0, lit[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in _ESCAPES:
                raise TemplateError(f"{where}: unsupported escape \\{nxt} in a string literal")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def tokens(src: str, where: str) -> list:
    out = []
    pos = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise TemplateError(f"{where}: cannot read {src[pos:]!r}")
        pos = m.end()
        kind = m.lastgroup
        text = m.group()
        if kind == "ws":
            continue
        if kind == "str":
            out.append(("lit", _go_string(text, where)))
        elif kind == "raw":
            out.append(("lit", text[1:-1]))
        elif kind == "num":
            if "." in text:
                raise TemplateError(f"{where}: float literals are not supported ({text})")
            out.append(("lit", int(text)))
        elif kind == "field":
            out.append(("field", [] if text == "." else text[1:].split(".")))
        elif kind == "ident":
            if text in ("true", "false"):
                out.append(("lit", text == "true"))
            elif text == "nil":
                out.append(("lit", None))
            else:
                out.append(("ident", text))
        else:
            out.append((text, None))
    return out


def parse_pipeline(toks: list, where: str) -> list:
    """A pipeline as a list of commands; a command is a list of operands, where an operand is
    ("lit", v), ("field", [names]), ("ident", fn) or ("pipe", pipeline)."""
    pipe, pos = _pipeline(toks, 0, where)
    if pos != len(toks):
        raise TemplateError(f"{where}: unexpected {toks[pos][0]!r}")
    if not pipe or any(not cmd for cmd in pipe):
        raise TemplateError(f"{where}: empty command")
    return pipe


def _pipeline(toks, pos, where):
    commands = [[]]
    while pos < len(toks):
        kind, value = toks[pos]
        if kind == ")":
            break
        if kind == "|":
            commands.append([])
            pos += 1
            continue
        if kind == "(":
            sub, pos = _pipeline(toks, pos + 1, where)
            if pos >= len(toks) or toks[pos][0] != ")":
                raise TemplateError(f"{where}: unclosed (")
            commands[-1].append(("pipe", sub))
            pos += 1
            continue
        commands[-1].append((kind, value))
        pos += 1
    return commands, pos


def parse(text: str, name: str) -> Template:
    items = lex(text, name)
    tpl = Template(name, [])
    # A stack of open blocks: ("root", body) / ("if", If-node, current body) / ("define", n, body).
    stack = [("root", tpl.body)]

    def body():
        return stack[-1][-1]

    for item in items:
        if isinstance(item, Text):
            if item.text:
                body().append(TextNode(item.text))
            continue
        src, where = item.src, item.where
        word = src.split(None, 1)[0] if src else ""
        rest = src[len(word):].strip()
        if word == "if":
            node = If([(parse_pipeline(tokens(rest, where), where), [])], [], where)
            body().append(node)
            stack.append(("if", node, node.branches[0][1]))
        elif word == "else":
            if stack[-1][0] != "if":
                raise TemplateError(f"{where}: else outside if")
            _, node, _ = stack.pop()
            if rest.startswith("if "):
                branch = (parse_pipeline(tokens(rest[3:], where), where), [])
                node.branches.append(branch)
                stack.append(("if", node, branch[1]))
            elif rest:
                raise TemplateError(f"{where}: unsupported else form {rest!r}")
            else:
                stack.append(("else", node, node.otherwise))
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError(f"{where}: end without a block")
            kind, what, content = stack.pop()
            if kind == "define":
                tpl.defines[what] = content
        elif word == "define":
            toks = tokens(rest, where)
            if len(toks) != 1 or toks[0][0] != "lit" or not isinstance(toks[0][1], str):
                raise TemplateError(f"{where}: define takes one string")
            if len(stack) != 1:
                raise TemplateError(f"{where}: define inside a block")
            stack.append(("define", toks[0][1], []))
        elif word in ("range", "with", "template", "block", "break", "continue") or ":=" in src \
                or src.startswith("$"):
            raise TemplateError(f"{where}: {word or src!r} is not supported by this renderer")
        else:
            body().append(Output(parse_pipeline(tokens(src, where), where), where))
    if len(stack) != 1:
        raise TemplateError(f"{name}: a block is not closed with end")
    return tpl


# -------------------------------------------------------------------------------------- evaluation
def truth(v) -> bool:
    """Go template truth (and Sprig's `empty`, negated): nil, false, 0, "" and empty maps/lists
    are false."""
    if v is None or v is False:
        return False
    if isinstance(v, (int, float, str, list, dict)):
        return bool(v)
    return True


def go_print(v, where: str = "") -> str:
    """A value as text/template prints it (fmt.Print of what Helm holds)."""
    if v is None:
        return ""       # "<no value>", which Helm blanks
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return go_float(float(v))
    if isinstance(v, str):
        return v
    raise TemplateError(f"{where}: printing a {type(v).__name__} (use toYaml)")


def go_float(f: float) -> str:
    """strconv.FormatFloat(f, 'g', -1, 64), which is how fmt prints the float64 Helm holds every
    number of the values in: the shortest digits that read back as f, in exponent form when the
    decimal exponent is < -4 or >= 6 (8080 -> "8080", 0.5 -> "0.5", 1000000 -> "1e+06")."""
    if f != f or f in (float("inf"), float("-inf")):
        raise TemplateError(f"cannot print {f}")
    if f == 0:
        return "0"
    sign = "-" if f < 0 else ""
    mantissa, _, e = repr(abs(f)).partition("e")     # Python's repr is the shortest round trip
    ip, _, fp = mantissa.partition(".")
    digits = ip + fp
    point = len(ip) + (int(e) if e else 0)          # digits[:point] is the integer part
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    exp = point - 1
    if exp < -4 or exp >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%s%se%s%02d" % (sign, body, "+" if exp >= 0 else "-", abs(exp))
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    if point > 0:
        return sign + digits[:point] + "." + digits[point:]
    return sign + "0." + "0" * (-point) + digits


def go_quote(s: str) -> str:
    """fmt's %q of a string: double quotes, Go escapes, printable characters kept."""
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7f:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    # Multi-line strings as block literals, as Helm's toYaml writes them.
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def to_yaml(v) -> str:
    """Helm's toYaml: the value as YAML, keys sorted, without the trailing newline."""
    text = yaml.dump(v, Dumper=_Dumper, default_flow_style=False, sort_keys=True,
                     allow_unicode=True, width=1 << 30)
    if text.endswith("\n...\n"):
        text = text[:-5]
    return text.rstrip("\n") if text.endswith("\n") else text


def indent(n: int, s: str) -> str:
    pad = " " * n
    return pad + s.replace("\n", "\n" + pad)


class Renderer:
    def __init__(self, defines: dict):
        self.defines = defines
        self.depth = 0

    def render(self, nodes: list, dot) -> str:
        out = []
        for node in nodes:
            if isinstance(node, TextNode):
                out.append(node.text)
            elif isinstance(node, Output):
                out.append(go_print(self.pipeline(node.pipe, dot, node.where), node.where))
            elif isinstance(node, If):
                for pipe, content in node.branches:
                    if truth(self.pipeline(pipe, dot, node.where)):
                        out.append(self.render(content, dot))
                        break
                else:
                    out.append(self.render(node.otherwise, dot))
        return "".join(out)

    def pipeline(self, pipe: list, dot, where: str):
        value = _NOTHING
        for cmd in pipe:
            value = self.command(cmd, dot, where, value)
        return value

    def command(self, cmd: list, dot, where: str, piped):
        head = cmd[0]
        if head[0] == "ident":
            fn = FUNCTIONS.get(head[1])
            if fn is None:
                raise TemplateError(f"{where}: function {head[1]!r} is not supported")
            args = [self.operand(op, dot, where) for op in cmd[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            try:
                return fn(self, where, *args)
            except TypeError as exc:
                raise TemplateError(f"{where}: {head[1]}: {exc}") from None
        if len(cmd) != 1 or piped is not _NOTHING:
            raise TemplateError(f"{where}: {head!r} is not a function")
        return self.operand(head, dot, where)

    def operand(self, op, dot, where: str):
        kind, value = op
        if kind == "lit":
            return value
        if kind == "pipe":
            return self.pipeline(value, dot, where)
        if kind == "field":
            cur = dot
            walked = ""
            for name in value:
                if cur is None:
                    raise TemplateError(f"{where}: nil pointer evaluating interface {{}}.{name} "
                                        f"(at .{walked.lstrip('.')})")
                if not isinstance(cur, dict):
                    raise TemplateError(f"{where}: can't evaluate field {name} in a {type(cur).__name__}")
                cur = cur.get(name)
                walked += "." + name
            return cur
        if kind == "ident":
            fn = FUNCTIONS.get(value)
            if fn is None:
                raise TemplateError(f"{where}: function {value!r} is not supported")
            return fn(self, where)
        raise TemplateError(f"{where}: unexpected {kind}")

    def include(self, where: str, name: str, dot) -> str:
        if name not in self.defines:
            raise TemplateError(f"{where}: no template {name!r}")
        self.depth += 1
        if self.depth > 50:
            raise TemplateError(f"{where}: include nested too deeply ({name})")
        try:
            return self.render(self.defines[name], dot)
        finally:
            self.depth -= 1


_NOTHING = object()


def _printf(r, where, fmt, *args):
    out, i, k = [], 0, 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1: i + 2]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if k >= len(args):
            raise TemplateError(f"{where}: printf: missing argument for %{verb}")
        arg = args[k]
        k += 1
        if verb == "s":
            if not isinstance(arg, str):
                # Go prints %!s(float64=8080) here; a chart should never do it.
                raise TemplateError(f"{where}: printf %s of a {type(arg).__name__}")
            out.append(arg)
        elif verb == "v":
            out.append(go_print(arg, where))
        else:
            raise TemplateError(f"{where}: printf verb %{verb} is not supported (use %s or %v)")
    if k != len(args):
        raise TemplateError(f"{where}: printf: too many arguments")
    return "".join(out)


def _required(r, where, msg, value):
    if value is None or (isinstance(value, str) and not value):
        raise TemplateError(f"{where}: {msg}")
    return value


def _str(where, v, fn):
    if not isinstance(v, str):
        raise TemplateError(f"{where}: {fn} of a {type(v).__name__}")
    return v


def _and(r, where, *args):
    if not args:
        raise TemplateError(f"{where}: and needs arguments")
    for a in args:
        if not truth(a):
            return a
    return args[-1]


def _or(r, where, *args):
    if not args:
        raise TemplateError(f"{where}: or needs arguments")
    for a in args:
        if truth(a):
            return a
    return args[-1]


def _eq(r, where, a, *others):
    def kind(v):
        return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v)
    for b in others:
        if kind(a) != kind(b):
            raise TemplateError(f"{where}: eq: incompatible types {type(a).__name__} and {type(b).__name__}")
    return any(a == b for b in others)


FUNCTIONS = {
    "include": lambda r, where, name, dot: r.include(where, name, dot),
    "toYaml": lambda r, where, v: to_yaml(v),
    "indent": lambda r, where, n, s: indent(n, _str(where, s, "indent")),
    "nindent": lambda r, where, n, s: "\n" + indent(n, _str(where, s, "nindent")),
    "quote": lambda r, where, *vs: " ".join(go_quote(go_print(v, where)) for v in vs if v is not None),
    "default": lambda r, where, d, v=None: v if truth(v) else d,
    "required": _required,
    "sha256sum": lambda r, where, s: hashlib.sha256(_str(where, s, "sha256sum").encode()).hexdigest(),
    "trunc": lambda r, where, n, s: _str(where, s, "trunc")[:n] if n >= 0 else s[n:],
    "trimSuffix": lambda r, where, suf, s: s[:-len(suf)] if suf and _str(where, s, "trimSuffix").endswith(suf) else s,
    "contains": lambda r, where, sub, s: _str(where, sub, "contains") in _str(where, s, "contains"),
    "printf": _printf,
    "not": lambda r, where, v: not truth(v),
    "and": _and,
    "or": _or,
    "eq": _eq,
    "ne": lambda r, where, a, b: not _eq(r, where, a, b),
}


# ------------------------------------------------------------------------------------- the chart
class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise TemplateError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml_strict(text: str):
    """YAML with duplicate keys refused (Helm and the API server refuse them too)."""
    return yaml.load(text, Loader=_StrictLoader)


def merge_values(base, override):
    """Helm's coalescing of user values over the chart's: maps merge key by key, anything else
    replaces, and a null removes the chart's key."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return override
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Rendered:
    files: dict          # template path -> rendered text (partials left out)
    objects: list        # [(template path, object, its rendered text)], in install order
    notes: str

    def manifest(self, header: str = "") -> str:
        """The objects' rendered text as one multi-document YAML file, like `helm template`'s
        output."""
        parts = [header] if header else []
        for source, _, text in self.objects:
            parts.append(f"---\n# Source: {source}\n{text.strip(chr(10))}\n")
        return "".join(parts)

    def of_kind(self, kind: str) -> list:
        return [obj for _, obj, _ in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
        return found[0]


def chart_meta(chart_dir: str) -> dict:
    with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as fh:
        chart = load_yaml_strict(fh.read())
    # Helm exposes Chart.yaml's fields capitalised.
    return {k[:1].upper() + k[1:]: v for k, v in chart.items()} | {"APIVersion": chart.get("apiVersion")}


def render(chart_dir: str = CHART, values: dict | None = None, release: str = PLAIN_RELEASE,
           namespace: str = "default") -> Rendered:
    """The chart rendered as `helm template <release> <chart> -f values` does."""
    with open(os.path.join(chart_dir, "values.yaml"), encoding="utf-8") as fh:
        defaults = load_yaml_strict(fh.read()) or {}
    chart = chart_meta(chart_dir)
    tdir = os.path.join(chart_dir, "templates")
    names = sorted(os.listdir(tdir))
    parsed = {}
    defines: dict = {}
    for name in names:
        with open(os.path.join(tdir, name), encoding="utf-8") as fh:
            tpl = parse(fh.read(), f"{chart['Name']}/templates/{name}")
        parsed[name] = tpl
        for key, body in tpl.defines.items():
            if key in defines:
                raise TemplateError(f"{tpl.name}: template {key!r} defined twice")
            defines[key] = body
    root = {
        "Values": merge_values(defaults, values or {}),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                    "IsInstall": True, "IsUpgrade": False, "Revision": 1},
        "Chart": chart,
        "Capabilities": None,
    }
    renderer = Renderer(defines)
    files, objects, notes = {}, [], ""
    for name, tpl in parsed.items():
        if name.startswith("_"):
            if renderer.render(tpl.body, root).strip():
                raise TemplateError(f"{tpl.name}: a partial renders text outside define")
            continue
        source = tpl.name
        text = renderer.render(tpl.body, dict(root, Template={"Name": source,
                                                             "BasePath": f"{chart['Name']}/templates"}))
        if name == "NOTES.txt":
            notes = text
            continue
        if not name.endswith((".yaml", ".yml")):
            raise TemplateError(f"{source}: unexpected file in templates/")
        files[source] = text
        for doc in re.split(r"(?m)^---[ \t]*$", text):
            try:
                obj = load_yaml_strict(doc)
            except (yaml.YAMLError, TemplateError) as exc:
                raise TemplateError(f"{source}: rendered YAML does not parse: {exc}\n{doc}") from None
            if obj is None:
                continue
            if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
                raise TemplateError(f"{source}: a rendered document is not a Kubernetes object")
            objects.append((source, obj, doc))
    order = {kind: i for i, kind in enumerate(INSTALL_ORDER)}
    objects.sort(key=lambda so: (order.get(so[1]["kind"], len(order)), so[1]["metadata"]["name"]))
    return Rendered(files, objects, notes)


PLAIN_HEADER = """\
# busbar as plain Kubernetes manifests: packaging/helm/busbar rendered with its default values
# (release name "busbar"), for `kubectl apply -n <namespace> -f packaging/k8s/busbar.yaml`.
# Generated; do not edit: change the chart and run
#   python tests/packaging/helm_render.py --write-plain
# (tests/packaging/test_helm.py fails while this file is out of date).
#
# Before applying, create the Secret the pods read (not included here; see docs/kubernetes.md):
#   kubectl create secret generic busbar \\
#     --from-literal=BUSBAR_REDIS_URL=redis://redis:6379/0 \\
#     --from-literal=BUSBAR_SIGNING_KEY=$(openssl rand -hex 32) \\
#     --from-literal=BUSBAR_ADMIN_TOKEN=$(openssl rand -hex 24) \\
#     --from-literal=OPENAI_API_KEY=sk-...
"""


def plain_manifest() -> str:
    return render().manifest(PLAIN_HEADER)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chart", nargs="?", default=CHART)
    p.add_argument("-f", "--values", action="append", default=[], help="a values file (repeatable)")
    p.add_argument("--release", default=PLAIN_RELEASE)
    p.add_argument("--write-plain", action="store_true", help=f"write {os.path.relpath(PLAIN, ROOT)}")
    args = p.parse_args(argv)
    if args.write_plain:
        os.makedirs(os.path.dirname(PLAIN), exist_ok=True)
        with open(PLAIN, "w", encoding="utf-8") as fh:
            fh.write(plain_manifest())
        print(f"wrote {os.path.relpath(PLAIN, ROOT)}", file=sys.stderr)
        return 0
    values: dict = {}
    for path in args.values:
        with open(path, encoding="utf-8") as fh:
            values = merge_values(values, load_yaml_strict(fh.read()) or {})
    sys.stdout.write(render(args.chart, values, args.release).manifest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
