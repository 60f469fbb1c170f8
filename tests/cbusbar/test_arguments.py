"""cbusbar/arguments.pyx: a tool call's arguments between text and object protocols. ObjectStream
is checked against orjson as the oracle of what a client can parse (as test_http.py checks the
request parser against httptools)."""
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cbusbar.arguments import RAW_KEY, ObjectStream


def stream(fragments):
    """(what went out per fragment, what went out at the end)."""
    s = ObjectStream()
    return [s.feed_py(f) for f in fragments], s.close_py()


def accumulated(fragments):
    sent, end = stream(fragments)
    return "".join(sent) + end


# ---------------------------------------------------------------------------------------------
# Cases a reviewer can read

@pytest.mark.parametrize("fragments,client", [
    (['{"ci', 'ty":"Paris"}'], {"city": "Paris"}),
    (["not ", "json"], {RAW_KEY: "not json"}),
    (["[1, 2]"], {RAW_KEY: "[1, 2]"}),                               # JSON, not an object
    (['{"city": "Par'], {"city": "Par", RAW_KEY: '{"city": "Par'}),  # cut off by max_tokens
    (['{"a": [1, tr', "ue, nu", "x"], {"a": [1, True, None], RAW_KEY: '{"a": [1, true, nux'}),
    (['{"a":1}', '{"b":2}'], {"a": 1, RAW_KEY: '{"a":1}{"b":2}'}),   # two calls run together
    (["{}x"], {RAW_KEY: "{}x"}),
    (['{"a":1,'], {"a": 1, RAW_KEY: '{"a":1,'}),
    (['{"a":{"b":1,'], {"a": {"b": 1, "": None}, RAW_KEY: '{"a":{"b":1,'}),
    (['{"k'], {"k": None, RAW_KEY: '{"k'}),
    (['{"x":1.'], {"x": 1.0, RAW_KEY: '{"x":1.'}),
    (['{"s":"\\ud83d'], {"s": "\U0001f400", RAW_KEY: '{"s":"\\ud83d'}),   # a high half gets its low
    (['{"s":"\\udc00"}'], {"s": "\ud000", RAW_KEY: '{"s":"\\udc00"}'}),   # a lone low half breaks at its c
])
def test_what_the_client_accumulates(fragments, client):
    assert orjson.loads(accumulated(fragments)) == client


def test_valid_fragments_go_out_as_they_came_the_close_at_the_end():
    sent, end = stream(['{"ci', 'ty":"Par', 'is"}', " "])
    assert sent == ['{"ci', 'ty":"Par', "", ""] and end == 'is"} '


def test_no_arguments_sends_nothing():
    assert stream([]) == ([], "")
    assert stream(["  ", "\n"]) == (["", ""], "")     # the client's input stays {}


# ---------------------------------------------------------------------------------------------
# Property: whatever the upstream streams, in whatever pieces

# what a decoder can hand over: str from orjson, never a lone surrogate
TEXT = st.characters(exclude_categories=("Cs",))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(TEXT, max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(TEXT, max_size=5), inner, max_size=4),
    max_leaves=12)


@st.composite
def argument_texts(draw):
    """Objects as models write them, cut off, corrupted, run together, or plain text."""
    obj = draw(st.dictionaries(st.text(TEXT, max_size=6), JSON, max_size=5))
    text = orjson.dumps(obj).decode()
    if draw(st.booleans()):
        text = text.replace(",", ", ").replace(":", ": ")
    how = draw(st.sampled_from(["whole", "cut", "corrupt", "twice", "text", "escapes"]))
    if how == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif how == "corrupt":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(alphabet='{}[]":,\\ tfn0.e-x\'', min_size=1, max_size=3)) + text[at:]
    elif how == "twice":
        text += text
    elif how == "text":
        text = draw(st.text(TEXT, max_size=30))
    elif how == "escapes":
        at = draw(st.integers(1, max(1, len(text) - 1)))
        text = text[:at] + draw(st.sampled_from(
            ['"\\u', '"\\ud83d', '"\\ud83d\\', '"\\ud83d\\ude00"', '"\\udc00"', '"\\', '"\\x"',
             '"\\u00e9"'])) + text[at:]
    return text


@st.composite
def split(draw, text):
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces, last = [], 0
    for c in cuts + [len(text)]:
        pieces.append(text[last:c])
        last = c
    return [p for p in pieces if p]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_client_always_gets_one_object_and_every_byte(data):
    text = data.draw(argument_texts())
    fragments = data.draw(split(text))
    sent, end = stream(fragments)
    out = "".join(sent) + end
    try:
        want = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        # the one thing the stream lets through that orjson refuses: a number past a double's
        # range (valid JSON grammar; a model has no reason to write one)
        assume("infinity" not in str(e))
        want = None
    if not text.strip(" \t\n\r"):
        assert out == ""                               # no arguments
        return
    got = orjson.loads(out)                            # always one object a client can parse
    assert isinstance(got, dict)
    if isinstance(want, dict):
        assert out == text and got == want             # a good object goes through untouched
    else:
        assert got[RAW_KEY] == text                    # anything else: all of it, under the key
    # nothing sent is ever taken back: what went out before the end is the text's own prefix
    assert text.startswith("".join(sent))
