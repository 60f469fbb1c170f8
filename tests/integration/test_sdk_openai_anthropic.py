"""The official openai and anthropic SDKs pointed at busbar, in all four combinations
(openai→openai, openai→anthropic, anthropic→anthropic, anthropic→openai), streaming and not,
including tools and a streamed tool call. The lanes answer from the built-in mock."""
import json

import anthropic
import openai
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
LANE = {"openai": "oai-model", "anthropic": "ant-model"}


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0, timeout=20)


@pytest.fixture(scope="module")
def ant(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="sk-ant-client", max_retries=0, timeout=20)


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_openai_sdk_text(oai, egress):
    r = oai.chat.completions.create(
        model=LANE[egress], max_tokens=50, temperature=0.7,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "ping one"}])
    msg = r.choices[0].message.content
    assert msg.startswith("mock: ping one") and "[system: be brief]" in msg
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    if egress == "anthropic":
        assert r.id.startswith("chatcmpl-")


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_openai_sdk_stream(oai, egress):
    chunks = list(oai.chat.completions.create(
        model=LANE[egress], stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream two"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("mock: stream two")
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_openai_sdk_max_tokens_stop(oai, egress):
    r = oai.chat.completions.create(model=LANE[egress], max_tokens=3,
                                    messages=[{"role": "user", "content": "a b c d e f"}])
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_openai_sdk_tool_round_trip(oai, egress):
    tools = [{"type": "function", "function": WEATHER}]
    msgs = [{"role": "user", "content": "weather in Paris? #mock:tool=1"}]
    r = oai.chat.completions.create(model=LANE[egress], messages=msgs, tools=tools)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "mock"}
    msgs = [{"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny 21C"}]
    r2 = oai.chat.completions.create(model=LANE[egress], messages=msgs, tools=tools)
    assert "[tool_result: sunny 21C]" in r2.choices[0].message.content


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_openai_sdk_streamed_tool_call(oai, egress):
    tools = [{"type": "function", "function": WEATHER}]
    stream = oai.chat.completions.create(
        model=LANE[egress], stream=True, tools=tools,
        messages=[{"role": "user", "content": "weather? #mock:tool=1"}])
    name, args, finish = None, "", None
    for c in stream:
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            name = tc.function.name or name
            args += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert name == "get_weather" and json.loads(args) == {"city": "mock"} and finish == "tool_calls"


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_anthropic_sdk_text(ant, egress):
    r = ant.messages.create(model=LANE[egress], max_tokens=50, system="terse",
                            messages=[{"role": "user", "content": "hello three"}])
    assert r.content[0].text.startswith("mock: hello three") and "[system: terse]" in r.content[0].text
    assert r.stop_reason == "end_turn" and r.usage.output_tokens > 0
    if egress == "openai":
        assert r.id.startswith("msg_")


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_anthropic_sdk_stream(ant, egress):
    with ant.messages.stream(model=LANE[egress], max_tokens=50,
                             messages=[{"role": "user", "content": "stream four"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("mock: stream four")
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    assert final.usage.input_tokens > 0


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_anthropic_sdk_tool_use_round_trip(ant, egress):
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"],
              "input_schema": WEATHER["parameters"]}]
    r = ant.messages.create(model=LANE[egress], max_tokens=100, tools=tools,
                            messages=[{"role": "user", "content": "weather? #mock:tool=1"}])
    assert r.stop_reason == "tool_use"
    use = [b for b in r.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "mock"}
    r2 = ant.messages.create(model=LANE[egress], max_tokens=100, tools=tools, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "rainy 12C"}]}])
    assert "[tool_result: rainy 12C]" in r2.content[0].text


@pytest.mark.parametrize("egress", ["openai", "anthropic"])
def test_anthropic_sdk_streamed_tool_use(ant, egress):
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"],
              "input_schema": WEATHER["parameters"]}]
    with ant.messages.stream(model=LANE[egress], max_tokens=100, tools=tools,
                             messages=[{"role": "user", "content": "weather? #mock:tool=1"}]) as s:
        final = s.get_final_message()
    use = [b for b in final.content if b.type == "tool_use"][0]
    assert use.input == {"city": "mock"} and final.stop_reason == "tool_use"


def test_anthropic_sdk_pool_in_path(gateway):
    # POST /{pool}/v1/messages: the URL decides routing; the body's model is ignored.
    c = anthropic.Anthropic(base_url=gateway.url + "/mixed", api_key="k", max_retries=0, timeout=20)
    seen = set()
    for _ in range(4):
        r = c.messages.create(model="ignored", max_tokens=20,
                              messages=[{"role": "user", "content": "pool"}])
        assert r.content[0].text.startswith("mock: pool")
        seen.add(r.id[:4])
    assert seen == {"msg_"}


def test_structured_output_reaches_anthropic_lane(oai):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    r = oai.chat.completions.create(
        model="ant-model", messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "reply", "schema": schema, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    assert json.loads(r.choices[0].message.content) == {"answer": "mock"}


def test_sdk_errors_are_native(oai, ant):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.create(model="missing", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.RateLimitError):
        ant.messages.create(model="oai-model", max_tokens=5,
                            messages=[{"role": "user", "content": "#mock:status=429"}])
