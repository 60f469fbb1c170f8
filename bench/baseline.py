"""--baseline REF: an older busbar, built once in a throwaway tree, benchmarked in the same run.

    prepare("main~5", python, log_dir) -> Baseline(sha, short, tree)
    prepare("HEAD", python, log_dir, patch="bench/ab/no-breaker.patch")   # --baseline-patch

With a patch (--baseline-patch FILE) the exported tree is REF with FILE applied (`git apply`), a
control built from the same code but one change: bench/ab/no-breaker.patch takes the circuit
breaker off the happy path, for the before/after of its cost. The tree is then
bench/.baseline/<sha>-<patch name>-<first 8 hex of the patch's sha256>/ and the row
busbar@<short sha>+<patch name>.

REF (a commit, branch or tag) is resolved to its full sha; its tree is exported with `git archive`
into bench/.baseline/<sha>/ (git-ignored; no worktree is registered in the repository) and its
Cython extensions are built in place there with the same Python that runs the bench
(`setup.py build_ext --inplace -q`, bounded in time). A tree that was built before is reused: its
marker file `.bench-built` is written only after a build succeeded. run.py then starts that tree's
busbar with PYTHONPATH pointing at it and checks, from /proc/<pid>/maps, that the extensions it
loaded are that tree's own.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import time

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
BASE_DIR = BENCH / ".baseline"
MARK = ".bench-built"


class BaselineError(Exception):
    """Why the baseline could not be prepared (one line, shown as is)."""


class Baseline:
    def __init__(self, ref, sha, tree, build_s, reused, patch=None):
        self.ref = ref
        self.sha = sha
        self.short = sha[:7]
        self.tree = tree
        self.build_s = build_s
        self.reused = reused
        self.patch = patch          # the patch applied to REF's tree (a path), or None
        self.name = "busbar@" + self.short + ("+" + _patch_name(patch) if patch else "")

    def meta(self):
        return {"ref": self.ref, "sha": self.sha, "short": self.short, "name": self.name,
                "tree": str(self.tree.relative_to(ROOT)), "build_s": round(self.build_s, 1),
                "reused": self.reused, "patch": str(self.patch) if self.patch else None,
                "same_code": False if self.patch else same_code(self.sha)}


def _patch_name(patch) -> str:
    return pathlib.Path(patch).name.rsplit(".", 1)[0]


# What makes a busbar different from another: its code and how it is built.
CODE_PATHS = ("busbar", "cbusbar", "setup.py", "pyproject.toml")


def same_code(sha: str):
    """True when this working tree's busbar code (CODE_PATHS, uncommitted changes included) is
    the same as at `sha`: the comparison is then an A/A run, its two rows differ by noise only.
    None when git cannot tell."""
    try:
        p = _git("diff", "--quiet", sha, "--", *CODE_PATHS)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(p.returncode)


def _git(*args, timeout=60):
    return subprocess.run(["git", "-C", str(ROOT)] + list(args), capture_output=True,
                          timeout=timeout)


def resolve(ref: str) -> str:
    p = _git("rev-parse", "--verify", "--quiet", ref + "^{commit}")
    sha = p.stdout.decode().strip()
    if p.returncode != 0 or len(sha) != 40:
        raise BaselineError("--baseline %s: not a commit, branch or tag in this repository" % ref)
    return sha


def _shown(path: pathlib.Path) -> str:
    """path relative to the repository when it lies inside it (c1_isolation logs to a temp dir)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def prepare(ref: str, python: str, log_dir, build_timeout: float = 900.0, log=print,
            patch=None) -> Baseline:
    sha = resolve(ref)
    key = sha
    if patch is not None:
        patch = pathlib.Path(patch).resolve()
        if not patch.is_file():
            raise BaselineError("--baseline-patch %s: no such file" % patch)
        key = "%s-%s-%s" % (sha, _patch_name(patch), hashlib.sha256(patch.read_bytes()).hexdigest()[:8])
    tree = BASE_DIR / key
    if (tree / MARK).exists():
        log("baseline %s (%s): reusing the tree built in %s" % (ref, sha[:7], tree.relative_to(ROOT)))
        return Baseline(ref, sha, tree, 0.0, True, patch)
    BASE_DIR.mkdir(exist_ok=True)
    tmp = BASE_DIR / (".tmp-%s-%d" % (key, os.getpid()))
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.monotonic()
    try:
        log("baseline %s (%s): exporting the tree to %s" % (ref, sha[:7], tmp.relative_to(ROOT)))
        arch = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", sha],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=arch.stdout,
                               capture_output=True, timeout=300)
        arch.stdout.close()
        err = arch.stderr.read()
        arch.wait(60)
        if arch.returncode != 0 or untar.returncode != 0:
            raise BaselineError("--baseline %s: git archive | tar failed: %s%s" % (
                ref, err.decode(errors="replace")[-300:], untar.stderr.decode(errors="replace")[-300:]))
        if not (tmp / "setup.py").exists():
            raise BaselineError("--baseline %s: the tree at %s has no setup.py" % (ref, sha[:7]))
        if patch is not None:
            p = subprocess.run(["git", "apply", str(patch)], cwd=str(tmp), capture_output=True,
                               timeout=60)
            if p.returncode != 0:
                raise BaselineError("--baseline-patch %s does not apply to %s: %s" % (
                    patch.name, sha[:7], p.stderr.decode(errors="replace").strip()[-300:]))
            log("baseline %s (%s): applied %s" % (ref, sha[:7], patch.name))
        log_path = pathlib.Path(log_dir) / ("baseline-%s-build.log" % sha[:7])
        log("baseline %s (%s): building its extensions in place (bounded at %.0f s; log: %s)"
            % (ref, sha[:7], build_timeout, _shown(log_path)))
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        with open(log_path, "wb") as out:
            try:
                p = subprocess.run([python, "setup.py", "build_ext", "--inplace", "-q"], cwd=str(tmp),
                                   stdout=out, stderr=subprocess.STDOUT, env=env,
                                   timeout=build_timeout)
            except subprocess.TimeoutExpired:
                raise BaselineError("--baseline %s: building %s's extensions did not finish within "
                                    "%.0f s (log: %s)" % (ref, sha[:7], build_timeout, log_path)) from None
        if p.returncode != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise BaselineError("--baseline %s: building %s's extensions failed (exit %d): %s (log: %s)"
                                % (ref, sha[:7], p.returncode, " | ".join(tail), log_path))
        (tmp / MARK).write_text(key + "\n")
        if tree.exists():           # a concurrent run built it meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(tree)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    build_s = time.monotonic() - t0
    log("baseline %s (%s): built in %.0f s" % (ref, sha[:7], build_s))
    return Baseline(ref, sha, tree, build_s, False, patch)


def loaded_from(pid_list, tree) -> bool:
    """True when one of the processes has mapped a cbusbar extension from `tree` (and none from
    elsewhere): the baseline really runs its own code."""
    tree = str(tree) + os.sep
    own = other = 0
    for pid in pid_list:
        try:
            with open("/proc/%d/maps" % pid) as f:
                for line in f:
                    if "/cbusbar/" in line and line.rstrip().endswith(".so"):
                        if line.split(None, 5)[-1].strip().startswith(tree):
                            own += 1
                        else:
                            other += 1
        except OSError:
            continue
    return own > 0 and other == 0
