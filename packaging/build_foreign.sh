#!/usr/bin/env bash
# Builds dist/<arch>/busbar for another architecture on this machine (what `make dist ARCH=arm64`
# runs on an x86_64 host): a Debian root filesystem of that architecture, run through the
# kernel's binfmt_misc and Debian's qemu-user-static, installs the dependencies and runs
# packaging/build.sh there, as a native build does; cbusbar's C is compiled on this machine by
# Debian's cross compiler against that root filesystem (the same compiler, ~100x faster than under
# emulation: the one step that would otherwise take hours).
#
#   packaging/build_foreign.sh arm64
#
# The root filesystem (1.1 GB with its build venv) is made once by debootstrap and kept outside
# the work tree: $BUSBAR_ROOTFS, default ${XDG_CACHE_HOME:-~/.cache}/busbar/rootfs-<arch>. Each run
# copies the work tree's files (git ls-files: tracked and new, not ignored) into its /src, keeping
# the venv at /opt/busbar-venv. Needs root (debootstrap, chroot, mounts); installs
# qemu-user-static, binfmt-support and debootstrap when missing. Everything runs at nice 19.
#
# Differences from a native build: cbusbar is compiled once, plain -O2 (no profile-guided pass: its
# training would run emulated), and staticx's bootloader is built from its sdist with musl-gcc
# (PyPI has no aarch64 wheel of it).
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:?usage: packaging/build_foreign.sh arm64}
PY=${PY:-.venv/bin/python}     # this machine's Python, with Cython: drives the cross compile
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac
case "$arch" in
    arm64) deb_arch=arm64; qemu="qemu-aarch64"; elf_machine=aarch64; triplet=aarch64-linux-gnu ;;
    *) echo "build_foreign.sh: $arch: only arm64 is built under emulation" >&2; exit 2 ;;
esac
[[ $(id -u) == 0 ]] || { echo "build_foreign.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
ROOTFS=${BUSBAR_ROOTFS:-${XDG_CACHE_HOME:-$HOME/.cache}/busbar/rootfs-$arch}
OUT=dist/$arch
say() { printf 'build_foreign.sh: %s\n' "$*" >&2; }
in_root() { nice -n 19 chroot "$ROOTFS" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
    LANG=C.UTF-8 "$@"; }

# --- emulation ----------------------------------------------------------------------------------
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v "$triplet-gcc" >/dev/null || need+=("gcc-$triplet")
[[ -x /usr/bin/$qemu-static || -x /usr/libexec/qemu-binfmt/$elf_machine-binfmt-P ]] || need+=(qemu-user-static binfmt-support)
if ((${#need[@]})); then
    say "installing Debian packages: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
    mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/$qemu ]]; then
    update-binfmts --enable "$qemu"
fi
# The F flag: the kernel opens the interpreter when it is registered, so it works inside a chroot.
grep -q '^flags:.*F' "/proc/sys/fs/binfmt_misc/$qemu" \
    || { say "binfmt_misc's $qemu entry lacks the F flag: it cannot run inside the root filesystem"; exit 1; }

# --- the root filesystem ------------------------------------------------------------------------
PACKAGES=python3,python3-venv,python3-dev,gcc,libc6-dev,make,binutils,ca-certificates,file,musl-tools
if [[ ! -x $ROOTFS/usr/bin/python3 ]]; then
    say "debootstrap $deb_arch into $ROOTFS (once; minutes)"
    mkdir -p "$ROOTFS"
    nice -n 19 debootstrap --arch="$deb_arch" --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS"
fi
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
# pip inside trusts what this host trusts (a TLS-inspecting proxy's root, say); the executable
# still carries the root filesystem's own ca-certificates bundle.
host_ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
[[ -f $host_ca ]] && cp "$host_ca" "$ROOTFS/etc/host-ca-bundle.crt"
mounted=()
cleanup() { for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" || true; done; }
trap cleanup EXIT
for m in proc dev; do
    if ! mountpoint -q "$ROOTFS/$m"; then
        if [[ $m == proc ]]; then mount -t proc proc "$ROOTFS/proc"; else mount --bind /dev "$ROOTFS/dev"; fi
        mounted=("$ROOTFS/$m" "${mounted[@]}")
    fi
done
IFS=, read -r -a wanted <<< "$PACKAGES"
installed=$(in_root dpkg-query -W -f '${Status}\n' "${wanted[@]}" 2>/dev/null | grep -c 'install ok installed' || true)
if [[ $installed != "${#wanted[@]}" ]]; then
    say "installing into the root filesystem: ${wanted[*]}"
    in_root apt-get update -qq
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}"
fi
[[ $(in_root uname -m) == "$elf_machine" ]] || { say "the root filesystem does not run as $elf_machine"; exit 1; }

# --- the sources --------------------------------------------------------------------------------
# What the previous run compiled (cbusbar's .c and .so, build/) stays, so that only what changed
# is compiled again; a source file the work tree no longer has goes (PyInstaller would pack it).
say "copying the work tree into $ROOTFS/src"
mkdir -p "$ROOTFS/src"
git ls-files -co --exclude-standard | sort > "$ROOTFS/src.files"
(cd "$ROOTFS/src" && find . -type f \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.yaml' \) \
    ! -path './build/*' ! -path './dist/*' | sed 's|^\./||' | sort) \
    | comm -23 - "$ROOTFS/src.files" | (cd "$ROOTFS/src" && xargs -r rm -f --)
tr '\n' '\0' < "$ROOTFS/src.files" | tar --null -T - -cf - | tar -xf - -C "$ROOTFS/src"

# --- the build ----------------------------------------------------------------------------------
VENV=/opt/busbar-venv
SCONS=4.11.1      # builds staticx's bootloader (below)
in_root /bin/sh -ec "
cd /src
[ -x $VENV/bin/python ] || python3 -m venv $VENV
python3 packaging/runtime_deps.py > /tmp/runtime.txt
[ -f /etc/host-ca-bundle.crt ] && export PIP_CERT=/etc/host-ca-bundle.crt
$VENV/bin/pip install -q --disable-pip-version-check -r /tmp/runtime.txt -r requirements-build.txt \
    scons==$SCONS
# staticx's sdist runs scons to build its bootloader (with musl-gcc): in this venv, where scons is
# (an isolated build environment would hide the venv's packages from it).
PATH=$VENV/bin:\$PATH BOOTLOADER_CC=musl-gcc $VENV/bin/pip install -q --disable-pip-version-check \
    --no-build-isolation -r packaging/requirements.txt
"
# cbusbar, cross-compiled: this machine's setup.py with the root filesystem's Python build
# configuration (its _sysconfigdata: the extension suffix, the flags) and headers.
pyver=$(in_root python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
sysconfig_dir=$(mktemp -d)
cp "$ROOTFS/usr/lib/python$pyver/_sysconfigdata__linux_$triplet.py" "$sysconfig_dir/"
say "compiling cbusbar for $triplet"
(cd "$ROOTFS/src" && _PYTHON_HOST_PLATFORM="linux-$elf_machine" \
    _PYTHON_SYSCONFIGDATA_NAME="_sysconfigdata__linux_$triplet" PYTHONPATH="$sysconfig_dir" \
    CC="$triplet-gcc" LDSHARED="$triplet-gcc -shared" LDFLAGS="--sysroot=$ROOTFS" \
    CFLAGS="--sysroot=$ROOTFS -I$ROOTFS/usr/include/python$pyver -I$ROOTFS/usr/include/$triplet/python$pyver" \
    nice -n 19 "$PY" setup.py -q build_ext --inplace -j 2)
rm -rf "$sysconfig_dir"
in_root /bin/sh -ec "cd /src && VENV=$VENV packaging/build.sh"
mkdir -p "$OUT"
cp "$ROOTFS/src/dist/busbar" "$OUT/busbar.new"
mv -f "$OUT/busbar.new" "$OUT/busbar"
file "$OUT/busbar" >&2
say "$OUT/busbar: $(wc -c < "$OUT/busbar" | tr -d ' ') bytes"
