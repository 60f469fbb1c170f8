"""TEMPORARY: the codec-contract names the engine calls, for codec modules that do not define them
yet (the codec refactor adds them to cbusbar/proto). Removed when every codec has them."""
from __future__ import annotations

import os

from cbusbar import transform


def _uuid() -> str:
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def _header(headers, name):
    if headers:
        for k, v in headers:
            if k == name:
                return v
    return None


def patch(mod, name):
    def has(attr):
        return hasattr(mod, attr)

    if not has("BODY_MODEL"):
        mod.BODY_MODEL = name in ("openai", "responses", "cohere", "anthropic")
    if not has("NEEDS_MAX_TOKENS"):
        mod.NEEDS_MAX_TOKENS = name == "anthropic"
    if not has("forced_tool_name"):
        mod.forced_tool_name = lambda req: None
    if not has("wants_stream_usage"):
        if name == "openai":
            def wants(req):
                so = req.extra.get("stream_options") if req.extra else None
                return isinstance(so, dict) and so.get("include_usage") is True
        else:
            def wants(req):
                return False
        mod.wants_stream_usage = wants
    if not has("stream_encoder"):
        enc_cls = mod.StreamEncoder

        def stream_encoder(id, model, include_usage, json_array):
            enc = enc_cls(id, model)
            if name == "openai":
                enc.include_usage = include_usage
            elif name == "gemini":
                enc.json_array = json_array
            return enc
        mod.stream_encoder = stream_encoder
    if not has("response_headers"):
        if name == "anthropic":
            def rh(up, rid):
                v = _header(up, b"request-id")
                return b"request-id: " + (v or rid.encode()) + b"\r\n"
        elif name == "bedrock":
            def rh(up, rid):
                v = _header(up, b"x-amzn-requestid")
                return b"x-amzn-RequestId: " + (v or _uuid().encode()) + b"\r\n"
        else:
            def rh(up, rid):
                return b""
        mod.response_headers = rh
    if not has("error_headers"):
        if name == "anthropic":
            def eh(kind, rid):
                return b"request-id: " + rid.encode() + b"\r\n"
        elif name == "bedrock":
            def eh(kind, rid):
                return b"x-amzn-RequestId: %b\r\nx-amzn-ErrorType: %b\r\n" % (
                    _uuid().encode(), mod.error_type(kind).encode())
        else:
            def eh(kind, rid):
                return b""
        mod.error_headers = eh
    if not has("not_found_message"):
        if name == "gemini":
            def nf(model, version):
                return ("models/%s is not found for API version %s, or is not supported for the "
                        "task you are trying to perform." % (model, version or "v1beta"))
        else:
            def nf(model, version):
                return "The model '%s' does not exist or you do not have access to it." % model
        mod.not_found_message = nf
    if not has("read_error_detail"):
        def red(body):
            try:
                return (mod.read_error(body), None)
            except Exception:
                return (None, None)
        mod.read_error_detail = red
    if name == "bedrock" and not getattr(mod, "_SHIM_CACHE", False):
        wr = mod.write_request

        def write_request(req):
            transform.clear_cache_control(req)
            return wr(req)
        mod.write_request = write_request
        mod._SHIM_CACHE = True
    return mod
