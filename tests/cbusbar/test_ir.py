"""cbusbar/ir.pyx: the IR's constructors, copies, dict views and the status <-> kind tables."""
import pytest

from cbusbar import ir


def test_usage_copy_is_independent_and_complete():
    u = ir.Usage(10, 5, 3, 2, 1, input_known=False)
    c = u.copy()
    assert c.to_dict() == u.to_dict() and c.input_known is False and c is not u
    c.input_tokens = 99
    assert u.input_tokens == 10
    assert ir.Usage().input_known is True


@pytest.mark.parametrize("status,kind", [
    (400, "invalid_request"), (401, "authentication"), (403, "permission"), (404, "not_found"),
    (413, "request_too_large"), (422, "invalid_request"), (429, "rate_limit"), (500, "api_error"),
    (502, "api_error"), (503, "overloaded"), (529, "overloaded"), (504, "timeout")])
def test_kind_of_status(status, kind):
    assert ir.kind_of_status(status) == kind


def test_every_kind_has_a_status_and_round_trips_where_unique():
    assert set(ir.STATUS_OF_KIND) == set(ir.ERROR_KINDS)
    for kind, status in ir.STATUS_OF_KIND.items():
        if kind != "quota":  # quota shares 429 with rate_limit
            assert ir.kind_of_status(status) == kind


def test_event_constructors():
    b = ir.text_block("hi")
    assert (b.kind, b.text) == (ir.TEXT, "hi")
    e = ir.ev_message_start("id", "m", ir.Usage(1))
    assert (e.kind, e.id, e.model, e.usage.input_tokens) == (ir.MESSAGE_START, "id", "m", 1)
    e = ir.ev_block_start(2, b)
    assert (e.kind, e.index, e.block) == (ir.BLOCK_START, 2, b)
    e = ir.ev_block_delta(2, ir.DELTA_TEXT, "x")
    assert (e.kind, e.index, e.delta_kind, e.text) == (ir.BLOCK_DELTA, 2, ir.DELTA_TEXT, "x")
    assert (ir.ev_block_stop(2).kind, ir.ev_block_stop(2).index) == (ir.BLOCK_STOP, 2)
    e = ir.ev_message_delta(ir.MAX_TOKENS, "s", None)
    assert (e.kind, e.stop_reason, e.stop_sequence, e.usage) == (ir.MESSAGE_DELTA, ir.MAX_TOKENS, "s", None)
    assert ir.ev_message_stop().kind == ir.MESSAGE_STOP
    e = ir.ev_error("overloaded", "busy")
    assert (e.kind, e.error_kind, e.message) == (ir.EVENT_ERROR, "overloaded", "busy")


def test_dict_views_show_what_is_set():
    blk = ir.Block(ir.TOOL_RESULT, id="c1", content=[ir.text_block("r")], is_error=True)
    assert blk.to_dict() == {"kind": ir.TOOL_RESULT, "id": "c1", "is_error": True,
                             "content": [{"kind": ir.TEXT, "text": "r"}]}
    req = ir.Request()
    req.model = "m"
    req.messages.append(ir.Message(ir.USER, [ir.text_block("q")]))
    req.tools.append(ir.Tool("f", "d", {"type": "object"}))
    d = req.to_dict()
    assert d["model"] == "m" and d["stream"] is False and "extra" not in d
    assert d["messages"] == [{"role": ir.USER, "content": [{"kind": ir.TEXT, "text": "q"}]}]
    assert d["tools"] == [{"name": "f", "description": "d", "schema": {"type": "object"}}]
    resp = ir.Response()
    assert resp.to_dict()["usage"] == ir.Usage().to_dict() and resp.content == []
    ev = ir.ev_block_delta(0, ir.DELTA_TEXT, "t")
    assert ev.to_dict() == {"kind": ir.BLOCK_DELTA, "index": 0, "delta_kind": ir.DELTA_TEXT, "text": "t"}


def test_codec_error_is_a_value_error():
    assert issubclass(ir.CodecError, ValueError)
