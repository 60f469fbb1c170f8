#!/usr/bin/env bash
# Builds dist/busbar: one static executable (no Python, no libc needed where it runs).
#
#   packaging/build.sh           # reuses dist/busbar when its inputs are unchanged
#   packaging/build.sh --force   # always rebuilds
#
# On macOS and Windows (the release workflow's runners: .github/workflows/release.yml) the same
# script makes dist/busbar (dist/busbar.exe) with PyInstaller alone: those systems always have
# their C library, so there is nothing for staticx to do, and there is no image.
#
# Also writes the container image around it (packaging/oci_image.py): dist/oci/ (an OCI image
# layout) and dist/busbar-image.tar (`docker load -i dist/busbar-image.tar`).
#
# 1. PyInstaller (packaging/busbar.spec) freezes busbar, the compiled cbusbar extensions of the
#    work tree, every runtime dependency (pyproject.toml's), providers.yaml and a CA bundle into
#    one stripped file (the interpreter and its libraries inside).
# 2. staticx wraps that file with the libc, libm and loader it needs and a static bootloader, so
#    `ldd dist/busbar` says "not a dynamic executable". It runs with --no-compress: the archive is
#    recompressed by packaging/sxpack.py instead (xz for the libraries, stored for the
#    already-compressed PyInstaller payload), which keeps start-up fast and the file small.
#
# Needs the compiled extensions (`make build`), Python 3.11 in .venv, and binutils, libc-bin and
# ca-certificates from Debian; it installs what is missing (apt-get, and packaging/requirements.txt
# into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
case "$(uname -s)" in
    Linux) OS=linux ;;
    Darwin) OS=macos ;;
    MINGW* | MSYS* | CYGWIN*) OS=windows ;;
    *) echo "build.sh: $(uname -s) is not a platform busbar is built for" >&2; exit 1 ;;
esac
if [[ $OS == windows ]]; then
    PY="$VENV/Scripts/python.exe"
    OUT=dist/busbar.exe
    export PATH="$PWD/$VENV/Scripts:$PATH"
else
    PY="$VENV/bin/python"
    OUT=dist/busbar
    case "$VENV" in /*) export PATH="$VENV/bin:$PATH" ;; *) export PATH="$PWD/$VENV/bin:$PATH" ;; esac
fi
WORK=build/pyinstaller
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

say() { printf 'build.sh: %s\n' "$*" >&2; }
size() { wc -c < "$1" | tr -d ' '; }

# --- tools --------------------------------------------------------------------------------------
need_apt=()
if [[ $OS == linux ]]; then
    for tool in objcopy strip readelf; do command -v "$tool" >/dev/null || need_apt+=(binutils); done
    command -v ldd >/dev/null || need_apt+=(libc-bin)
    [[ -f ${BUSBAR_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt} ]] || need_apt+=(ca-certificates)
    if ((${#need_apt[@]})); then
        say "installing Debian packages: ${need_apt[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need_apt[@]}" | sort -u)
    fi
fi
if [[ ! -x $PY ]]; then
    say "no $PY: run 'make build' first"
    exit 1
fi
if ! "$PY" - <<'EOF' 2>/dev/null
import sys
from importlib import metadata
from packaging.requirements import Requirement
for line in open("packaging/requirements.txt"):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    r = Requirement(line)
    if (r.marker is None or r.marker.evaluate()) and not r.specifier.contains(metadata.version(r.name)):
        sys.exit(1)
EOF
then
    say "installing packaging/requirements.txt into $VENV"
    "$PY" -m pip install -q --disable-pip-version-check -r packaging/requirements.txt
fi

# --- inputs -------------------------------------------------------------------------------------
# The one extension (cbusbar/_native, every compiled module linked together: setup.py) must exist and
# be newer than every Cython source: an older one would be frozen as it is. Building it is `make
# build`'s job (it compiles the whole tree).
native=$(ls cbusbar/_native.*.so cbusbar/_native.*.pyd 2>/dev/null | head -n1 || true)
stale=()
while IFS= read -r src; do
    if [[ -z $native || $native -ot $src ]]; then stale+=("$src"); fi
done < <({ find cbusbar -name '*.pyx' -o -name '*.pxd'; find busbar -name '*.pxd' | while read -r p; do
    echo "$p"; echo "${p%.pxd}.py"; done; } | sort)
if ((${#stale[@]})); then
    say "cbusbar/_native missing or older than: ${stale[*]}"
    say "run 'make build' first"
    exit 1
fi

# The container image around the executable (same as the Dockerfile's; seconds, reproducible).
image() { [[ $OS != linux ]] || "$PY" packaging/oci_image.py --executable "$OUT" >&2; }

digest=$("$PY" packaging/inputs.py)
if ((!FORCE)) && [[ -x $OUT && -f dist/busbar.inputs && $(cat dist/busbar.inputs) == "$digest" ]]; then
    say "$OUT is current ($(size "$OUT") bytes)"
    image
    exit 0
fi

# --- build --------------------------------------------------------------------------------------
# PyInstaller reads a snapshot of the sources: extensions rebuilt in the work tree while it runs
# would otherwise end up half-copied in the archive. The snapshot is taken until it matches the
# digest computed on either side of it.
# --force rebuilds PyInstaller's own work too: its archive of modules (PYZ) is reused whenever the
# list of modules is unchanged, even when the way they are compiled changed.
((FORCE)) && rm -rf "$WORK/work"
mkdir -p dist "$WORK"
rm -f dist/busbar.inputs
SRC="$WORK/src"
for attempt in 1 2 3; do
    rm -rf "$SRC"
    mkdir -p "$SRC"
    find busbar cbusbar -not -path '*/__pycache__/*' \
        \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.so' -o -name '*.pyd' -o -path 'busbar/data/*.yaml' -o -path 'busbar/observability/status.html' \) -print0 \
        | tar --null -T - -cf - | tar -xf - -C "$SRC"
    after=$("$PY" packaging/inputs.py)
    [[ $after == "$digest" ]] && break
    digest=$after
    ((attempt < 3)) || { say "sources keep changing under the build; try again"; exit 1; }
done
say "PyInstaller"
# PYTHONNODEBUGRANGES: the modules are compiled (optimize=2, packaging/busbar.spec) without the
# column ranges of every instruction, which only draw the ^^^ under a traceback's line (line
# numbers stay): a third less line-table per code object, less to inflate and to keep in memory
# for every module imported.
BUSBAR_SRC="$PWD/$SRC" PYINSTALLER_ZLIB_COMPRESSION_LEVEL=9 PYTHONNODEBUGRANGES=1 "$PY" -m PyInstaller --noconfirm --log-level WARN \
    --distpath "$WORK/dist" --workpath "$WORK/work" packaging/busbar.spec
if [[ $OS != linux ]]; then
    # The result must run (Windows' Python needs SYSTEMROOT: no empty environment there).
    version=$("$WORK/dist/$(basename "$OUT")" --version)
    mv -f "$WORK/dist/$(basename "$OUT")" "$OUT"
    echo "$digest" > dist/busbar.inputs
    say "$OUT: $version, $(size "$OUT") bytes"
    exit 0
fi
say "staticx"
staticx --strip --no-compress "$WORK/dist/busbar" "$WORK/busbar.static"
"$PY" packaging/sxpack.py "$WORK/busbar.static" >&2
chmod 0755 "$WORK/busbar.static"

# The result must be static and must run.
ldd_says=$(ldd "$WORK/busbar.static" 2>&1 || true)
if [[ $ldd_says != *"not a dynamic executable"* ]]; then
    say "staticx output is still dynamic"; exit 1
fi
version=$(env -i "$WORK/busbar.static" --version)
mv -f "$WORK/busbar.static" "$OUT"
echo "$digest" > dist/busbar.inputs
say "$OUT: $version, $(size "$OUT") bytes"
image
