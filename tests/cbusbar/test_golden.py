"""Golden translation files: tests/golden/<ingress>_to_<egress>/<case>.{in,out}.{json,txt}.
A reviewer reads a translation as data; this runner only wires the codecs together (docs/codecs.md)."""
import importlib
import pathlib

import orjson
import pytest

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


def _codec(name):
    return importlib.import_module(f"cbusbar.proto.{name}")


@pytest.mark.parametrize("ingress,egress,path", list(_cases()))
def test_golden(ingress, egress, path):
    src, dst = _codec(ingress), _codec(egress)
    out_path = path.with_name(path.name.replace(".in.", ".out."))
    data = path.read_bytes()
    case = path.name.split(".in.")[0]
    if case.startswith("request_"):
        req = src.read_request(data)
        req.extra = {}
        req.model = FIXED_MODEL
        if egress == "anthropic" and req.max_tokens is None:
            req.max_tokens = 4096
        got = orjson.loads(dst.write_request(req))
        assert got == orjson.loads(out_path.read_bytes())
    elif case.startswith("response_"):
        resp = dst.read_response(data)
        resp.id = FIXED_ID
        resp.created = 1700000000
        got = orjson.loads(src.write_response(resp))
        assert got == orjson.loads(out_path.read_bytes())
    elif case.startswith("stream_"):
        dec = dst.StreamDecoder()
        enc = src.StreamEncoder(FIXED_ID, FIXED_MODEL)
        if hasattr(enc, "created"):
            enc.created = 1700000000
        out = bytearray()
        for i in range(0, len(data), 7):
            out += enc.encode(dec.feed(data[i:i + 7]))
        out += enc.encode(dec.close())
        assert bytes(out) == out_path.read_bytes()
    else:
        pytest.fail(f"unknown golden case kind: {path.name}")
