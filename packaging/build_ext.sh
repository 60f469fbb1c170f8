#!/bin/sh
# Compiles the extension in place (cbusbar/_native: every Cython module linked into one shared object,
# setup.py says why), profile-guided, and installs the tree editable into the venv (what `make build`
# and the Dockerfile run). PGO=0: one plain -O2 compile instead.
#
#   1. BUSBAR_PGO=generate: an instrumented extension (counters written to build/pgo/ at exit);
#   2. packaging/pgo_train.py: the gateway serves every protocol pair through them (~5 s);
#   3. BUSBAR_PGO=use: the final extension, each function's hot path packed together.
# Why: a request at concurrency 1 finds the code it runs cold in the caches whenever another
# process ran on its core in between, and pays for every page and cache line of it; the profile
# packs what a request runs together (a small call's pages 2,880 -> 2,579 KiB, the exchange's 228 ->
# 132; README, Performance: "Issue #13: what stands in the way", its first item).
# Cython runs once (step 1); step 3 only recompiles the C. The last step registers the editable
# install only (BUSBAR_NO_EXT=1: pip's own build would compile everything once more, ~2 min).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
JOBS=$(nproc 2>/dev/null || echo 2)
if [ "${PGO:-1}" != 0 ]; then
    rm -rf build/pgo
    BUSBAR_PGO=generate "$PY" setup.py -q build_ext --inplace --force -j "$JOBS"
    "$PY" packaging/pgo_train.py
    BUSBAR_PGO=use "$PY" setup.py -q build_ext --inplace --force -j "$JOBS"
    export BUSBAR_NO_EXT=1
fi
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
