"""bench/code_lines.py reads callgrind's instruction-level output (compressed names, relative
positions, call lines) into the addresses each function ran, and counts lines and pages."""
from __future__ import annotations

from tests.bench import bench_module as _module

code_lines = _module("code_lines")

# What callgrind --dump-instr=yes writes: "(id) name" the first time, "(id)" after; positions
# absolute (0x...), relative (+N / -N) or the same (*); the line after calls= is the call site.
OUT = """\
version: 1
creator: callgrind-3.19.0
positions: instr line
events: Ir

ob=(1) /t/cbusbar/_native.so
fl=(1) x.c
fn=(1) hot
0x1000 10 3
+4 11 1
+60 12 2
cob=(2) /usr/lib/libpython3.11.so
cfi=(2) y.c
cfn=(2) PyDict_GetItem
calls=2 0x9000 5
* 12 40
-64 13 1

ob=(2)
fl=(2)
fn=(2)
0x9000 5 20
0x9040 6 20
0x3000 7 1
"""


def test_parse_names_and_positions(tmp_path):
    p = tmp_path / "callgrind.out"
    p.write_text(OUT)
    ran = code_lines.parse(p)
    # The call site's line (after calls=) carries the call's inclusive cost: its address counts,
    # its 40 does not.
    assert dict(ran[("/t/cbusbar/_native.so", "hot")]) == {0x1000: 4, 0x1004: 1, 0x1040: 2}
    assert dict(ran[("/usr/lib/libpython3.11.so", "PyDict_GetItem")]) == {
        0x9000: 20, 0x9040: 20, 0x3000: 1}


def test_summarise_counts_lines_and_pages_per_mapping_and_own_functions(tmp_path):
    p = tmp_path / "callgrind.out"
    p.write_text(OUT)
    by, funcs, lines, pages = code_lines.summarise(code_lines.parse(p), "/t/")
    # _native: 0x1000 0x1004 0x1040 0x1000 -> lines 0x40 and 0x41, one page;
    # libpython: 0x9000 0x9040 0x3000 -> three lines, two pages.
    assert by == [("libpython3.11.so", 3, 2), ("_native.so", 2, 1)]
    assert funcs == [("hot", 2, 3, 7)]
    assert (lines, pages) == (5, 3)
