"""Recompresses the archive inside a staticx executable so that it starts fast and stays small.

staticx appends its payload (a tar of the program and of the libraries it needs: libc, libm, the
loader...) as the ELF section `.staticx.archive`, either plain or as one xz stream. For a PyInstaller
program neither is good: the program is already zlib-compressed, so xz gains ~1% on it while its
decoder still has to work through every byte (~250 ms for 10 MB here, at every start), and a plain
archive carries the 3.3 MB of libraries uncompressed.

This module rewrites the section as one xz stream that mixes LZMA2's two chunk kinds: the tar
members that compress (the smaller libraries, the tar headers) become LZMA2-compressed chunks, and
the members that do not (the PyInstaller program) or whose decoding would cost too much start-up
time (libc) become stored chunks, which the decoder copies. The
staticx bootloader (xz-embedded) decodes any valid xz stream; this one uses the LZMA2 filter alone
and no integrity check (an executable's own bytes carry none either).

    python packaging/sxpack.py dist/busbar          # in place; input made with staticx --no-compress

Standard library only: lzma (raw LZMA2 encoding), zlib (CRC32 of the xz headers), tarfile.
"""
from __future__ import annotations

import io
import lzma
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import zlib

SECTION = ".staticx.archive"
XZ_MAGIC = b"\xfd7zXZ\x00"
CHECK_NONE = 0x00
LZMA2_ID = 0x21
DICT_SIZE = 1 << 23          # 8 MiB: more than any library here; the decoder allocates this much
STORED_CHUNK = 1 << 16       # LZMA2's largest uncompressed chunk
# A member that deflate cannot shrink by this fraction is stored instead.
MIN_SAVING = 0.05
# So is a member larger than this. The bootloader's decoder (xz-embedded) runs at ~35 MB/s here,
# at every start: libc (1.9 MB, 1.1 MB saved) would add ~45 ms to each start-up, libm (0.9 MB,
# 0.6 MB saved) ~20 ms. So only the smaller libraries are compressed: the loader (0.2 MB, 0.13 MB
# saved, ~6 ms), libz (0.12 MB, 0.07 MB saved, ~3 ms), the nss and compatibility stubs (~15 KB
# each). Measured on the build machine (CPU of the process tree for `busbar --version`, 25 runs
# alternated): everything over 1 MiB stored 241.8 ms median, over 64 KiB stored 218.7 ms for
# +0.77 MB of file, nothing compressed 218.0 ms. 256 KiB keeps the executable under 18 MB.
STORE_OVER = 256 << 10


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _crc32(b: bytes) -> bytes:
    return struct.pack("<I", zlib.crc32(b))


def _dict_size_byte(size: int) -> int:
    """LZMA2's one-byte dictionary size: 2^(n/2+12) or 3*2^((n-1)/2+11), the smallest that fits."""
    for n in range(41):
        base = (2 | (n & 1)) << (n // 2 + 11)
        if base >= size:
            return n
    return 40


def _lzma2_compressed(data: bytes) -> bytes:
    """Raw LZMA2 chunks for `data`, without the end marker. The first chunk resets the dictionary
    and sets properties (control byte >= 0xE0), so the piece can follow any other chunk."""
    enc = lzma.compress(data, format=lzma.FORMAT_RAW,
                        filters=[{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME,
                                  "dict_size": DICT_SIZE}])
    if not data:
        return b""
    if enc[-1] != 0x00 or enc[0] < 0xE0:
        raise RuntimeError("unexpected LZMA2 framing from liblzma")
    return enc[:-1]


def _lzma2_stored(data: bytes) -> bytes:
    """Stored LZMA2 chunks: 0x01 (dictionary reset) first, then 0x02; each at most 64 KiB."""
    out = bytearray()
    for i in range(0, len(data), STORED_CHUNK):
        part = data[i:i + STORED_CHUNK]
        out.append(0x01 if i == 0 else 0x02)
        out += struct.pack(">H", len(part) - 1)
        out += part
    return bytes(out)


def split_tar(tar_bytes: bytes):
    """(start, end, compressible) ranges covering the tar: each regular member's data is its own
    range; headers and padding go with the compressible ranges around them."""
    ranges = []
    pos = 0
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for m in tar.getmembers():
            if not m.isreg() or m.size == 0:
                continue
            start, end = m.offset_data, m.offset_data + m.size
            if start > pos:
                ranges.append([pos, start, True])
            ranges.append([start, end, None])
            pos = end
    if pos < len(tar_bytes):
        ranges.append([pos, len(tar_bytes), True])
    return ranges


def lzma2_mixed(data: bytes) -> bytes:
    """LZMA2 data (with end marker) for `data`: compressed where it pays, stored where it does not."""
    pieces = []          # (compressible, bytes) with neighbours of the same kind merged
    for start, end, kind in split_tar(data):
        chunk = data[start:end]
        if kind is None:
            # zlib at level 1 is a quick judge: already-compressed data gains nothing from it either.
            kind = (len(chunk) <= STORE_OVER
                    and len(zlib.compress(chunk, 1)) < len(chunk) * (1 - MIN_SAVING))
        if pieces and pieces[-1][0] == kind:
            pieces[-1][1].append(chunk)
        else:
            pieces.append((kind, [chunk]))
    out = bytearray()
    for compressible, chunks in pieces:
        joined = b"".join(chunks)
        out += _lzma2_compressed(joined) if compressible else _lzma2_stored(joined)
    out.append(0x00)
    return bytes(out)


def xz_stream(data: bytes) -> bytes:
    """One .xz stream, one block, filter chain LZMA2 alone, check None (xz file format 1.0.4)."""
    flags = bytes((0x00, CHECK_NONE))
    header = XZ_MAGIC + flags + _crc32(flags)

    # Block header: size byte, block flags (one filter, no optional sizes), the LZMA2 filter with
    # its dictionary-size property, zero padding to a multiple of 4 with the CRC32 that follows.
    bh = bytearray((0x00, 0x00))
    bh += _varint(LZMA2_ID) + _varint(1) + bytes((_dict_size_byte(DICT_SIZE),))
    bh += b"\x00" * (-len(bh) % 4)
    bh[0] = (len(bh) + 4) // 4 - 1
    block_header = bytes(bh) + _crc32(bytes(bh))

    packed = lzma2_mixed(data)
    block = block_header + packed
    unpadded = len(block)
    block += b"\x00" * (-len(block) % 4)

    index = b"\x00" + _varint(1) + _varint(unpadded) + _varint(len(data))
    index += b"\x00" * (-len(index) % 4)
    index += _crc32(index)

    backward = struct.pack("<I", len(index) // 4 - 1)
    footer = _crc32(backward + flags) + backward + flags + b"YZ"
    return header + block + index + footer


def read_section(path: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "section")
        subprocess.run(["objcopy", "--dump-section", "%s=%s" % (SECTION, out), path, os.path.join(tmp, "copy")],
                       check=True, capture_output=True)
        with open(out, "rb") as f:
            return f.read()


def write_section(path: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        blob = os.path.join(tmp, "section")
        with open(blob, "wb") as f:
            f.write(data)
        subprocess.run(["objcopy", "--update-section", "%s=%s" % (SECTION, blob), path],
                       check=True, capture_output=True)


def repack(path: str) -> tuple[int, int]:
    """Rewrites the staticx archive of the executable at `path`; returns (old, new) section sizes."""
    raw = read_section(path)
    if raw.startswith(XZ_MAGIC):
        raw = lzma.decompress(raw)
    stream = xz_stream(raw)
    if lzma.decompress(stream) != raw:      # liblzma reads it back before the file is touched
        raise RuntimeError("repacked archive does not decode to the original")
    write_section(path, stream)
    return len(raw), len(stream)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        old, new = repack(p)
        print("%s: %s %d -> %d bytes" % (p, SECTION, old, new))
