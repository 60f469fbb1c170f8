"""The access log's line as cbusbar.accesslog writes it is the record `fields()` describes (same
keys, order and values) on awkward records; its buffer keeps lines whole and in order across the
writer thread, refuses lines past its limit, and the LineWriter writes, rotates and counts drops."""
from __future__ import annotations

import json
import os
import threading
import time

from cbusbar.accesslog import LineBuffer, append_line
from cbusbar.ir import Usage

from busbar.engine.records import Attempt, RequestRecord
from busbar.observability import lines
from busbar.observability.access_log import AccessLog, fields


def _rec(**kw):
    r = RequestRecord()
    for k, v in kw.items():
        setattr(r, k, v)
    return r


AWKWARD = [
    _rec(),                                                         # every field unset
    _rec(request_id="req_" + "ab" * 12, ingress="anthropic", target="chat", lane="claude",
         model="claude-haiku-4-5", status=200, outcome="ok", attempts=(Attempt(None, 0),) * 3,
         busbar_ns=13999, upstream_ns=158432123, usage=Usage(12, 8, 3, 0, 0), client="127.0.0.1",
         key_id="vk_1", group="team-a"),
    _rec(target='p"o\\ol\n\t\r\x01\x1fé✓', lane="l\u2028", model="", status=503,
         outcome="exhausted", busbar_ns=0, upstream_ns=999, usage=Usage(0, 0, 0, 0, 0),
         client="::1"),
    _rec(target=None, status=404, outcome="client_error", upstream_ns=2_000_000_000_000,
         busbar_ns=4999, client="203.0.113.9"),
    # A pool with hooks: its gates' decisions and the wait for them (busbar/hooks/run.py).
    _rec(target="chat", status=451, outcome="client_error", hooks="pii:rewrite,guard:reject",
         hook_ns=1_234_567),
    _rec(target="chat", status=200, outcome="ok", hooks='g"\n :order', hook_ns=999),
]


def test_the_line_is_fields_exactly():
    now = 1764764467.0429
    for rec in AWKWARD:
        buf = LineBuffer(1 << 20)
        n = append_line(buf, rec, now)
        line = bytes(buf.take())
        assert n == len(line) and line.endswith(b"\n") and line.count(b"\n") == 1
        got = json.loads(line)
        want = json.loads(json.dumps(fields(rec, now)))
        assert list(got) == list(want)
        assert got == want, [(k, got[k], want[k]) for k in got if got[k] != want[k]]
    assert got["time"] == "2025-12-03T12:21:07.042Z"
    # Across a second boundary the cached second's text follows.
    buf = LineBuffer(1 << 20)
    append_line(buf, AWKWARD[1], now + 1.5)
    assert json.loads(bytes(buf.take()))["time"] == "2025-12-03T12:21:08.542Z"


class Name:
    """A name that is not a str: written as str(name) then, whatever it says at the time."""
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


def test_lines_on_alternating_routes_each_carry_their_own_route():
    # The route's fields are copied from the last line when they are the same objects: a line on
    # another route (any one of the four fields another object) writes its own; a name that is
    # not a str is written afresh every time.
    now = 1764764467.0429
    ing, pool, lane, model = "openai", "".join(["chat"]), "".join(["gpt"]), "".join(["gpt-x"])
    other = "".join(["chat"])       # equal text, another object
    name = Name("first")
    seq = [_rec(ingress=ing, target=pool, lane=lane, model=model),
           _rec(ingress=ing, target=pool, lane=lane, model=model),
           _rec(ingress="anthropic", target=pool, lane=lane, model=model),
           _rec(ingress=ing, target=None, lane=lane, model=model),
           _rec(ingress=ing, target=pool, lane=None, model=model),
           _rec(ingress=ing, target=pool, lane=lane, model=None),
           _rec(ingress=ing, target=other, lane=lane, model=model),
           _rec(ingress=ing, target=pool, lane=lane, model=model),
           _rec(ingress=ing, target=name, lane=lane, model=model)]
    for rec in seq + seq[::-1]:
        buf = LineBuffer(1 << 20)
        append_line(buf, rec, now)
        got = json.loads(bytes(buf.take()))
        assert got == json.loads(json.dumps(fields(rec, now), default=str))
    name.text = "second"
    buf = LineBuffer(1 << 20)
    append_line(buf, seq[-1], now)
    append_line(buf, seq[-1], now)
    assert [json.loads(x)["pool"] for x in bytes(buf.take()).splitlines()] == ["second"] * 2


def test_every_escape_at_every_offset():
    # The line copies eight bytes at once while none needs escaping: a character that does, at any
    # offset of a long or short field, must still be escaped as JSON does.
    now = 1764764467.0429
    for special in ('"', "\\", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028"):
        for n in range(0, 20):
            for at in range(n + 1):
                text = "a" * at + special + "b" * (n - at)
                buf = LineBuffer(1 << 20)
                append_line(buf, _rec(target=text, lane=text[::-1]), now)
                got = json.loads(bytes(buf.take()))
                assert got["pool"] == text and got["lane"] == text[::-1]


def test_buffer_take_done_and_limit():
    buf = LineBuffer(1000)
    assert buf.take() is None
    assert buf.append(b"a\n") and buf.append(b"b\n") and len(buf) == 4
    view = buf.take()
    assert bytes(view) == b"a\nb\n" and len(buf) == 0
    assert buf.append(b"c\n")                   # the loop goes on in the other buffer
    assert bytes(view) == b"a\nb\n"             # untouched until done()
    view.release()
    buf.done()
    assert bytes(buf.take()) == b"c\n"
    buf.done()
    big = b"x" * 600 + b"\n"
    assert buf.append(big) and buf.append(big)  # past the limit only once more than it is pending
    assert not buf.append(b"y\n") and append_line(buf, AWKWARD[1], time.time()) == 0
    assert bytes(buf.take()) == big * 2
    buf.done()
    many = b"z" * 100_000 + b"\n"               # grows by doubling, shrinks back once idle
    big_buf = LineBuffer(10 << 20)
    for _ in range(20):
        big_buf.append(many)
    assert len(bytes(big_buf.take())) == 20 * len(many)
    big_buf.done()
    assert bytes(big_buf.take() or b"") == b""


def test_lines_stay_whole_and_ordered_with_the_writer_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "FLUSH_SECS", 0.001)
    path = tmp_path / "access.jsonl"
    log = AccessLog(str(path))
    n = 20000
    for i in range(n):
        log.on_finish(_rec(request_id="req_%08d" % i, target="p", status=200, outcome="ok"))
        if i % 1000 == 0:
            time.sleep(0.002)                   # let the thread take a batch mid-stream
    log.close()
    ids = [json.loads(x)["request_id"] for x in path.read_text().splitlines()]
    assert ids == ["req_%08d" % i for i in range(n)] and log.writer.dropped == 0


def test_a_writer_that_cannot_keep_up_drops_and_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(lines, "MAX_BUFFERED", 4096)
    r, w = os.pipe()                            # nobody reads: the thread blocks in write(2)
    try:
        dropped = []
        log = AccessLog("stderr", on_drop=lambda: dropped.append(1))
        log.writer.fd = w
        os.set_blocking(w, True)
        ev = threading.Event()
        for _ in range(2000):
            log.on_finish(AWKWARD[1])
        ev.wait(0.3)
        for _ in range(2000):
            log.on_finish(AWKWARD[1])
        assert dropped and log.writer.dropped == len(dropped)
    finally:
        os.close(r)
        log.writer.stopping = True


def test_file_sink_rotation_still_works(tmp_path):
    path = tmp_path / "r.jsonl"
    w = lines.LineWriter(str(path), rotate_bytes=1000)
    for i in range(30):
        w.write(b'{"n":%d,"pad":"%s"}\n' % (i, b"x" * 80))
        w.flush()
    w.close()
    assert (tmp_path / "r.jsonl.1").exists() and path.stat().st_size <= 1000


def test_the_writer_sleeps_while_idle_and_a_line_wakes_it(tmp_path):
    """An idle worker's writer thread does not wake every flush period: it sleeps until a line lands
    in the empty buffer, writes it within the period, and sleeps again."""
    path = tmp_path / "idle.jsonl"
    w = lines.LineWriter(str(path))

    def wakeups():
        with open("/proc/self/task/%d/status" % w.thread.native_id) as f:
            return int(next(x for x in f if x.startswith("voluntary_ctxt_switches")).split()[1])

    try:
        time.sleep(0.2)
        n0 = wakeups()
        time.sleep(0.6)
        assert wakeups() == n0                      # six flush periods, not one wake-up
        for i in range(3):
            w.write(b'{"n":%d}\n' % i)
            deadline = time.monotonic() + 2
            while path.read_bytes().count(b"\n") < i + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert path.read_bytes().count(b"\n") == i + 1
            time.sleep(0.3)
        n1 = wakeups()
        time.sleep(0.6)
        assert wakeups() == n1
    finally:
        w.close()
    assert [json.loads(x)["n"] for x in path.read_text().splitlines()] == [0, 1, 2]
