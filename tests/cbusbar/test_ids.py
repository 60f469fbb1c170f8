"""cbusbar.ids: the codecs' random ids from a per-process pool of random bytes."""
import base64
import collections
import os
import re
import uuid

from cbusbar import ids


def test_formats():
    assert re.fullmatch(r"[0-9A-Za-z]{22}", ids.b62(22))
    assert re.fullmatch(r"[0-9a-f]{24}", ids.hex_id(12))
    s = ids.uuid4()
    u = uuid.UUID(s)
    assert str(u) == s and u.version == 4 and u.variant == uuid.RFC_4122
    for n in range(0, 40):
        t = ids.urlsafe(n)
        assert re.fullmatch(r"[A-Za-z0-9_-]*", t)
        assert len(base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))) == n


def test_no_repeats_across_pool_refills():
    seen = {ids.hex_id(16) for _ in range(5000)}       # ~20 refills of the 4 KiB pool
    assert len(seen) == 5000


def test_every_base62_character_turns_up_evenly():
    counts = collections.Counter("".join(ids.b62(100) for _ in range(2000)))
    assert len(counts) == 62
    assert max(counts.values()) < 1.25 * min(counts.values())   # 200,000 draws, ~3,226 each


def test_a_forked_child_does_not_reuse_its_parents_bytes():
    ids.b62(1)                  # the pool is filled and partly used
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, ids.hex_id(32).encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert child != ids.hex_id(32)
