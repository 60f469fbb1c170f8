"""packaging/sxpack.py: the xz stream it writes decodes (with liblzma) to the archive it was given,
with the incompressible member stored and the rest compressed."""
from __future__ import annotations

import io
import lzma
import os
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "packaging"))
import sxpack  # noqa: E402

sys.path.pop(0)


def make_tar(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("members", [
    [("lib.so", b"text " * 50_000), ("prog", os.urandom(300_000)), ("tail.so", b"abc" * 70_001)],
    [("prog", os.urandom(65_536 * 3 + 1))],          # stored chunks on and off the 64 KiB edge
    [("only-text", b"hello\n" * 10)],
    [("empty", b""), ("x", b"1")],
])
def test_stream_decodes_to_input(members):
    raw = make_tar(members)
    stream = sxpack.xz_stream(raw)
    assert stream.startswith(sxpack.XZ_MAGIC) and stream.endswith(b"YZ")
    assert lzma.decompress(stream, format=lzma.FORMAT_XZ) == raw


def test_random_member_stored_text_compressed():
    text, noise = b"library code " * 4_000, os.urandom(400_000)     # text under STORE_OVER
    stream = sxpack.xz_stream(make_tar([("lib.so", text), ("prog", noise)]))
    # The noise costs its own size plus 3 bytes per 64 KiB chunk; the text nearly nothing.
    assert len(noise) < len(stream) < len(noise) + len(noise) // 65_536 * 3 + 20_000
    ranges = sxpack.split_tar(make_tar([("lib.so", text), ("prog", noise)]))
    assert [kind for _, _, kind in ranges] == [True, None, True, None, True]


def test_large_member_stored():
    big = b"compressible library " * 60_000          # 1.26 MB, over STORE_OVER
    small = b"m" * 50_000                             # under it: compressed
    assert len(big) > sxpack.STORE_OVER > len(small)
    stream = sxpack.xz_stream(make_tar([("libc.so.6", big), ("libdl.so.2", small)]))
    assert len(big) < len(stream) < len(big) + 10_000
    assert lzma.decompress(stream) == make_tar([("libc.so.6", big), ("libdl.so.2", small)])


def test_dict_size_byte():
    assert sxpack._dict_size_byte(4096) == 0
    assert sxpack._dict_size_byte(1 << 23) == 22
    assert sxpack._dict_size_byte((1 << 23) + 1) == 23   # 12 MiB, the next size up
