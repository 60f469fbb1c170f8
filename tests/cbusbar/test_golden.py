"""Golden translation files: tests/golden/<ingress>_to_<egress>/<case>.{in,out}.{json,txt}.
A reviewer reads a translation as data; this runner calls the engine's translation functions."""
import pathlib

import orjson
import pytest

from busbar.engine.translate import (CODECS, ClientRequest, StreamTranslation, translate_response,
                                     write_request)

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "golden"
FIXED_ID = "golden-id"
FIXED_MODEL = "target-model"


def _cases():
    for d in sorted(GOLDEN.glob("*_to_*")):
        if d.name.startswith("embed_"):
            continue    # embeddings goldens: tests/cbusbar/test_embed.py
        ingress, egress = d.name.split("_to_")
        for f in sorted(d.glob("*.in.*")):
            yield pytest.param(ingress, egress, f, id=f"{d.name}/{f.name.split('.in.')[0]}")


@pytest.mark.parametrize("ingress,egress,path", list(_cases()))
def test_golden(ingress, egress, path):
    """Runs the engine's own translation steps (busbar/engine/translate.py), so a golden cannot pass
    while production translates differently."""
    src, dst = CODECS[ingress], CODECS[egress]
    out_path = path.with_name(path.name.replace(".in.", ".out."))
    data = path.read_bytes()
    case = path.name.split(".in.")[0]
    if case.startswith("request_"):
        cr = ClientRequest(src, data)
        body, _forced = write_request(cr, dst, FIXED_MODEL, cr.ir.stream, True, 4096)
        assert orjson.loads(body) == orjson.loads(out_path.read_bytes())
    elif case.startswith("response_"):
        body, _usage = translate_response(dst, src, data, None, FIXED_ID, FIXED_MODEL,
                                          created=1700000000)
        assert orjson.loads(body) == orjson.loads(out_path.read_bytes())
    elif case.startswith("stream_"):
        tx = StreamTranslation(dst, src, FIXED_ID, FIXED_MODEL, created=1700000000)
        out = bytearray()
        for i in range(0, len(data), 7):
            out += tx.feed(data[i:i + 7])
        out += tx.close()
        assert bytes(out) == out_path.read_bytes()
        assert tx.finished
    else:
        pytest.fail(f"unknown golden case kind: {path.name}")
