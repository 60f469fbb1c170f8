"""cbusbar/record.pyx: record_of reads an exchange's __slots__ at their offsets, and gives the same
record for an object of another shape (plain attributes, a subclass, an unset slot)."""
from __future__ import annotations

import pytest

from cbusbar.ir import Usage
from cbusbar.record import RequestRecord, record_of

from busbar.engine.records import Attempt

FIELDS = ("request_id", "proto", "target", "attempts", "stream", "client_status", "usage", "req",
          "t_end", "bytes_out", "conn", "principal", "denied")


class Slotted:
    __slots__ = FIELDS


class Sub(Slotted):
    __slots__ = ()


class Plain:
    pass


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _fill(ex, n_attempts=2):
    provider = Obj(protocol="openai")
    lanes = [Obj(name="lane-%d" % i, model=Obj(upstream_model="up-%d" % i, provider=provider))
             for i in range(n_attempts)]
    atts = []
    for i, lane in enumerate(lanes):
        a = Attempt(lane, 1000 * i)
        a.t_connected, a.t_end = 100 + 1000 * i, 600 + 1000 * i
        atts.append(a)
    ex.request_id, ex.proto, ex.target = "req_1", "anthropic", Obj(name="pool")
    ex.attempts, ex.stream, ex.client_status = atts, True, 200
    ex.usage, ex.req, ex.t_end = Usage(1, 2, 3, 4, 5), Obj(t0=10), 5000
    ex.bytes_out, ex.conn, ex.principal = 77, Obj(peer="10.0.0.1"), Obj(id="vk_1", group="g")
    ex.denied = None
    return ex


def _fields(r: RequestRecord):
    return (r.request_id, r.ingress, r.egress, r.target, r.lane, r.model, r.stream, r.status,
            r.outcome, [a.lane.name for a in r.attempts], type(r.attempts),
            (r.usage.input_tokens, r.usage.cache_write_tokens), r.t0, r.t_end, r.busbar_ns, r.upstream_ns,
            r.bytes_out, r.client, r.key_id, r.group, r.denied)


def test_every_shape_gives_the_same_record():
    want = None
    for cls in (Slotted, Sub, Plain, Slotted):      # the reader follows the type it meets
        ex = _fill(cls())
        r = record_of(ex, "ok")
        assert r.lane == "lane-1" and r.model == "up-1" and r.egress == "openai"
        assert r.upstream_ns == 1000 and r.busbar_ns == 5000 - 10 - 1000
        assert r.client == "10.0.0.1" and r.key_id == "vk_1" and r.status == 200 and r.stream
        got = _fields(r)
        assert want is None or got == want
        want = got
    ex = _fill(Slotted(), 0)
    r = record_of(ex, "client_error")
    assert r.attempts == () and r.lane is None and r.upstream_ns == 0


def test_an_unset_slot_raises_as_getattr_does():
    ex = _fill(Slotted())
    del ex.denied
    with pytest.raises(AttributeError):
        record_of(ex, "ok")
