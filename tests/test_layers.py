"""The package's import graph has no circle (issue #35): every import of one busbar module by
another, lazy ones inside functions included, read from the source; a strongly connected
component of more than one module is a circle, and it fails here naming its modules."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def modules():
    out = {}
    for p in sorted((ROOT / "busbar").rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def edges(mods):
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = base + "." + a.name
                    if full in mods:
                        graph[m].add(full)
                    elif base in mods:
                        graph[m].add(base)
    return graph


def circles(graph):
    """Tarjan's strongly connected components of more than one node, iteratively."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circle():
    assert circles(edges(modules())) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
