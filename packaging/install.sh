#!/bin/sh
# Installs busbar from a GitHub release: the executable for this OS and architecture, checked
# against the release's SHA256SUMS, and the provider catalog beside it.
#
#   curl -fsSL https://github.com/OWNER/busbar/releases/latest/download/install.sh | sh
#
# Environment (all optional):
#   BUSBAR_VERSION      a release (1.2.3 or v1.2.3); default: the latest
#   BUSBAR_INSTALL_DIR  where busbar and providers.yaml go; default: $HOME/.local/bin
#   BUSBAR_REPO         OWNER/NAME of the GitHub repository; the released copy of this script has
#                       its own repository filled in below
#   BUSBAR_BASE_URL     the releases URL itself (default https://github.com/$BUSBAR_REPO/releases)
#
# Linux and macOS, x86_64 and arm64 (Windows: the release's busbar-x86_64-pc-windows-msvc.zip).
# The latest release is found by the releases/latest/download/ redirect, never the GitHub API
# (whose unauthenticated rate limit fails shared addresses). Nothing is installed unless the
# download matches its SHA256SUMS line.
set -eu

# Filled in by the release workflow (.github/workflows/release.yml) in the copy it publishes.
DEFAULT_REPO=""

say() { printf 'install.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

repo=${BUSBAR_REPO:-$DEFAULT_REPO}
base=${BUSBAR_BASE_URL:-}
if [ -z "$base" ]; then
    [ -n "$repo" ] || die "set BUSBAR_REPO=OWNER/NAME (the GitHub repository busbar is released from)"
    base="https://github.com/$repo/releases"
fi
base=${base%/}
dir=${BUSBAR_INSTALL_DIR:-${HOME:?HOME is not set; set BUSBAR_INSTALL_DIR}/.local/bin}

# --- which asset ---------------------------------------------------------------------------------
os=$(uname -s)
arch=$(uname -m)
case "$arch" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *) die "no busbar release for the $arch architecture (x86_64 and arm64 only)" ;;
esac
case "$os" in
    Linux) target="$arch-unknown-linux-gnu" ;;
    Darwin)
        # A shell under Rosetta says x86_64 on Apple silicon: the native executable is the one.
        if [ "$arch" = x86_64 ] && [ "$(sysctl -n hw.optional.arm64 2>/dev/null || echo 0)" = 1 ]; then
            arch=aarch64
        fi
        target="$arch-apple-darwin" ;;
    *) die "no busbar release for $os here (Linux and macOS; on Windows unzip busbar-x86_64-pc-windows-msvc.zip)" ;;
esac
asset="busbar-$target.tar.gz"

case "${BUSBAR_VERSION:-latest}" in
    latest) url="$base/latest/download" ;;
    v*) url="$base/download/$BUSBAR_VERSION" ;;
    *) url="$base/download/v$BUSBAR_VERSION" ;;
esac

# --- tools ---------------------------------------------------------------------------------------
if command -v curl >/dev/null 2>&1; then
    fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }
elif command -v wget >/dev/null 2>&1; then
    fetch() { wget -q -O "$2" "$1"; }
else
    die "needs curl or wget"
fi
if command -v sha256sum >/dev/null 2>&1; then
    digest() { sha256sum "$1" | cut -d ' ' -f 1; }
elif command -v shasum >/dev/null 2>&1; then
    digest() { shasum -a 256 "$1" | cut -d ' ' -f 1; }
else
    die "needs sha256sum or shasum to check the download"
fi
command -v tar >/dev/null 2>&1 || die "needs tar"

# --- download and check --------------------------------------------------------------------------
tmp=$(mktemp -d 2>/dev/null || mktemp -d -t busbar)
trap 'rm -rf "$tmp"' EXIT INT TERM
say "downloading $url/$asset"
fetch "$url/$asset" "$tmp/$asset" || die "could not download $url/$asset"
fetch "$url/SHA256SUMS" "$tmp/SHA256SUMS" || die "could not download $url/SHA256SUMS"
want=$(awk -v f="$asset" '$2 == f || $2 == "*" f { print $1; exit }' "$tmp/SHA256SUMS")
[ -n "$want" ] || die "SHA256SUMS has no line for $asset"
got=$(digest "$tmp/$asset")
[ "$got" = "$want" ] || die "$asset does not match SHA256SUMS (got $got, want $want); nothing installed"

mkdir "$tmp/x"
tar -xzf "$tmp/$asset" -C "$tmp/x" || die "could not unpack $asset"
for f in busbar providers.yaml; do
    [ -f "$tmp/x/$f" ] || die "$asset has no $f"
done

# --- install -------------------------------------------------------------------------------------
mkdir -p "$dir" || die "cannot create $dir (set BUSBAR_INSTALL_DIR)"
# Each file is written beside its final name and renamed over it, so a running busbar is never
# replaced by half a file.
place() {  # place SOURCE NAME MODE
    if ! { cp "$1" "$dir/.$2.new" && chmod "$3" "$dir/.$2.new" && mv -f "$dir/.$2.new" "$dir/$2"; }; then
        rm -f "$dir/.$2.new"
        die "cannot write $dir/$2 (set BUSBAR_INSTALL_DIR)"
    fi
}
place "$tmp/x/busbar" busbar 0755
place "$tmp/x/providers.yaml" providers.yaml 0644

version=$("$dir/busbar" --version 2>/dev/null) || die "$dir/busbar does not run here"
say "installed $version: $dir/busbar, and $dir/providers.yaml"
case ":${PATH:-}:" in
    *":$dir:"*) ;;
    *) say "$dir is not on PATH: add it (export PATH=\"$dir:\$PATH\") or run $dir/busbar" ;;
esac
