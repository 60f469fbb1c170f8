"""docs/performance.md's block is generated from bench/published/ and must agree with it: a
figure changed by hand in docs/performance.md, or a published run not regenerated into it, fails here."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

from tests.bench import ROOT, bench_module as _module


readme = _module("readme")


def test_published_results_exist():
    assert readme.RESULTS.exists(), "bench/published/results.json is docs/performance.md's one source"
    results, _ = readme.load_published()
    for key in ("commit", "cpu", "cores", "command", "date"):
        assert results["meta"].get(key), key


def test_readme_block_agrees_with_published_results():
    results, soak = readme.load_published()
    _, block, _ = readme.split_doc(readme.DOC.read_text())
    assert block == readme.render_block(results, soak), (
        "docs/performance.md's block differs from bench/published/: run python bench/readme.py")


def test_a_changed_figure_is_caught():
    results, soak = readme.load_published()
    _, block, _ = readme.split_doc(readme.DOC.read_text())
    other = copy.deepcopy(results)
    row = next(r for e in other["cases"] for n, r in e["rows"].items()
               if n == "busbar" and "cpu_us_per_req" in r)
    row["cpu_us_per_req"] = row["cpu_us_per_req"] * 3 + 1
    assert readme.render_block(other, soak) != block


def test_check_mode_exit_status(tmp_path, monkeypatch):
    results, soak = readme.load_published()
    good = "intro\n\n" + readme.render_block(results, soak) + "\n\noutro\n"
    fake = tmp_path / "README.md"
    fake.write_text(good)
    monkeypatch.setattr(readme, "DOC", fake)
    assert readme.main(["--check"]) == 0
    fake.write_text(good.replace(readme.END, "| a hand-edited row |\n" + readme.END))
    assert readme.main(["--check"]) == 1
    assert readme.main([]) == 0          # regenerates
    assert fake.read_text() == good


def test_check_mode_runs_as_a_command():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "readme.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_published_file_is_small_and_has_no_per_run_details():
    data = readme.RESULTS.read_text()
    assert len(data) < 200_000
    doc = json.loads(data)
    assert all("runs" not in e for e in doc["cases"])
