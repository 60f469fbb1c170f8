"""cbusbar/transform.pyx: the forced structured-output tool unwrapped back into text."""
from cbusbar import ir, transform


def _tool(name, input, id="t1"):
    return ir.Block(ir.TOOL_USE, id=id, name=name, input=input)


def test_unwrap_forced_tool_buffered():
    resp = ir.Response()
    resp.content = [ir.text_block("pre"), _tool("structured_output", {"a": 1}), _tool("other", {"b": 2})]
    resp.stop_reason = ir.TOOL_USE_STOP
    transform.unwrap_forced_tool(resp, "structured_output")
    assert [(b.kind, b.text or b.name) for b in resp.content] == [
        (ir.TEXT, "pre"), (ir.TEXT, '{"a":1}'), (ir.TOOL_USE, "other")]
    assert resp.stop_reason == ir.END_TURN


def test_unwrap_keeps_string_input_and_leaves_other_answers_alone():
    resp = ir.Response()
    resp.content = [_tool("structured_output", '{"raw": true}')]
    resp.stop_reason = ir.MAX_TOKENS
    transform.unwrap_forced_tool(resp, "structured_output")
    assert resp.content[0].text == '{"raw": true}' and resp.stop_reason == ir.MAX_TOKENS
    resp = ir.Response()
    resp.content = [_tool("f", {})]
    resp.stop_reason = ir.TOOL_USE_STOP
    transform.unwrap_forced_tool(resp, "structured_output")
    assert resp.content[0].kind == ir.TOOL_USE and resp.stop_reason == ir.TOOL_USE_STOP


def test_stream_unwrapper_rewrites_only_the_forced_block():
    u = transform.ForcedToolUnwrapper("answer")
    events = u.apply([
        ir.ev_block_start(0, _tool("answer", None)),
        ir.ev_block_delta(0, ir.DELTA_INPUT_JSON, '{"a"'),
        ir.ev_block_start(1, _tool("other", None, "t2")),
        ir.ev_block_delta(1, ir.DELTA_INPUT_JSON, "{}"),
        ir.ev_message_delta(ir.TOOL_USE_STOP, None, None),
    ])
    assert (events[0].block.kind, events[0].block.text) == (ir.TEXT, "")
    assert events[1].delta_kind == ir.DELTA_TEXT
    assert events[2].block.kind == ir.TOOL_USE and events[3].delta_kind == ir.DELTA_INPUT_JSON
    assert events[4].stop_reason == ir.END_TURN
    plain = transform.ForcedToolUnwrapper("answer").apply([ir.ev_message_delta(ir.TOOL_USE_STOP, None, None)])
    assert plain[0].stop_reason == ir.TOOL_USE_STOP
