# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""How an upstream answer reaches the client: one small strategy per response mode, chosen by the
exchange when the attempt's upstream status and headers arrive (busbar/engine/exchange.py
`on_upstream_headers`), and then handed every body piece (`body`) and the end (`complete`).

- `ErrorBody`: a non-2xx answer: its body collected (at most limits.upstream_error_body_max_bytes), then
  classified by the exchange (`status_error`): another lane, or the caller's answer.
- `Buffer`: same protocol, buffered: collected, checked (its usage read), then answered whole.
- `Relay`: same protocol, streamed: bytes through, chunked to the client; the lane's stream tap
  reads the usage and sees whether the stream ended with its final event.
- `Translate`: another protocol, buffered: read into the IR, written in the caller's protocol.
- `TranslateStream`: another protocol, streamed: upstream frames → IR events → client frames.

Each mode is stateless, one instance for every exchange (busbar/engine/exchange.py makes them:
this module imports the Exchange's type, so it cannot make them while the two modules load). What
an attempt accumulates (the collected pieces, the tap, the stream translation) stays on the
Exchange, which is what its lifecycle's ends (`end_attempt`, `finish`) read. `streams`: the
client's answer is chunked and open while the upstream sends (past its first byte the
whole-request timeout bounds it); `end_event` is the native error event that ends such an answer
when the upstream fails after the first byte, None for a length-delimited answer (the connection
is closed instead).
"""
from __future__ import annotations

from cbusbar import ir
from cbusbar.clock import now_ns

from busbar.engine.records import F_MALFORMED, O_OK
from busbar.engine.status import header
from busbar.engine.translate import StreamTranslation, translate_response


class Mode:
    """The shape every mode has (and the default of each step)."""

    def __init__(self, streams=False):
        self.streams = streams

    def begin(self, ex, content_type):
        """The upstream's head arrived and this mode takes the answer."""
        ex.chunks = []

    def body(self, ex, chunk):
        pass

    def complete(self, ex):
        pass

    def end_event(self, ex, kind, message):
        return None


class ErrorBody(Mode):
    """A non-2xx answer's body: collected within its cap, what came of it classified."""

    def body(self, ex, chunk):
        ex._collect(chunk, ex.snap.limits.upstream_error_body_max_bytes)

    def complete(self, ex):
        ex.status_error(b"".join(ex.chunks) if ex.chunks is not None else b"")


class Buffer(Mode):
    """Same protocol, buffered: the answer as the upstream wrote it, once it proved readable."""

    def body(self, ex, chunk):
        if not ex._collect(chunk, ex.snap.limits.request_body_max_bytes):
            ex.fault(F_MALFORMED, "upstream response exceeds the maximum size")

    def complete(self, ex):
        # The body download is upstream time; checking it and reading its usage are busbar's.
        ex.rtt = now_ns() - ex.t_send
        body = b"".join(ex.chunks)
        ex.chunks = None
        try:
            op = ex.op
            if op is None:
                ex.usage = ex.codec.read_usage(body)
            else:
                ex.usage = op.read_usage(ex.egress.protocol, body)
        except ir.CodecError as e:
            ex.fault(F_MALFORMED, str(e))
            return
        headers = ex.up_headers
        ex.answer(header(headers, b"content-type") or b"application/json", body,
                  ex.ingress.response_headers(headers, ex.rid()))


class Translate(Buffer):
    """Another protocol, buffered: the lane's answer read into the IR, written in the caller's."""

    def complete(self, ex):
        # The body download is upstream time, not busbar's (BENCHMARK.md).
        ex.rtt = now_ns() - ex.t_send
        body = b"".join(ex.chunks)
        ex.chunks = None
        ing = ex.ingress
        try:
            op = ex.op
            if op is None:
                out, ex.usage = translate_response(ex.codec, ing, body, ex.forced, ing.mint_id(),
                                                   ex.last_model)
            else:
                out, ex.usage = op.response(ex, ex.egress.protocol, body)
        except ir.CodecError as e:
            ex.fault(F_MALFORMED, str(e))
            return
        ex.answer(b"application/json", out, ing.response_headers(None, ex.rid()))


class Relay(Mode):
    """Same protocol, streamed: the upstream's bytes through, chunked; the tap reads along."""

    def begin(self, ex, content_type):
        codec = ex.codec
        # the usage tap, and how the stream ended (docs/codecs.md `StreamTap`)
        ex.tap = getattr(codec, "StreamTap", codec.StreamDecoder)()
        ex.tap_error = False
        ex.head_chunked(200, content_type or codec.STREAM_CONTENT_TYPE,
                        ex.ingress.response_headers(ex.up_headers, ex.rid()))

    def body(self, ex, chunk):
        tap = ex.tap
        if tap is not None:
            try:
                events = tap.feed(chunk)
            except Exception:
                if not ex.sent:
                    # reliability: a malformed 2xx before the first byte is the lane's fault and
                    # another lane can still answer (SPEC §4.1).
                    ex.fault(F_MALFORMED, "the upstream stream cannot be read")
                    return
                ex.tap = None       # the tap never breaks a relay it cannot read
                events = None
                _billing_lost(ex)
            if events:
                _tap_events(ex, events)
                if ex.tap_error:
                    chunk = ex.snap.mask.mask(chunk)
        rf = ex.relay
        if rf is not None:
            # After the tap: it reads the usage this filter hides from the client.
            chunk = rf.feed(chunk)
            if not chunk:
                return
            if ex.tap_error:
                chunk = ex.snap.mask.mask(chunk)
        ex.chunk(chunk)

    def complete(self, ex):
        tap = ex.tap
        if tap is not None:
            try:
                events = tap.close()
            except Exception:
                events = None
                ex.tap = None
                _billing_lost(ex)
            if events:
                _tap_events(ex, events)
            if ex.tap is not None:
                ex.usage = tap.usage
            if ex.tap is not None and not (ex.tap_error or tap.finished):
                # Ended cleanly at the HTTP level but without the protocol's final event.
                ex.truncated()
                return
        ex.end_attempt(None)
        rf = ex.relay
        if rf is not None:
            rest = rf.close()
            if rest:
                if ex.tap_error:
                    rest = ex.snap.mask.mask(rest)
                ex.chunk(rest)
        ex.end_chunks(O_OK)

    def end_event(self, ex, kind, message):
        ing = ex.ingress
        return ing.stream_encoder(ing.mint_id(), ex.name, False, False).error(kind, message)


class TranslateStream(Mode):
    """Another protocol, streamed: the lane's frames through IR events into the caller's."""

    def begin(self, ex, content_type):
        ing = ex.ingress
        cr = ex.cr
        json_array = ex.route.json_array
        ex.tx = StreamTranslation(ex.codec, ing, ing.mint_id(), ex.last_model, ex.forced,
                                  cr.stream_usage if cr is not None else False, json_array,
                                  mask=ex.snap.mask)
        ex.head_chunked(200, b"application/json" if json_array else ing.STREAM_CONTENT_TYPE,
                        ing.response_headers(None, ex.rid()))

    def body(self, ex, chunk):
        try:
            out = ex.tx.feed(chunk)
        except ir.CodecError as e:
            ex.fault(F_MALFORMED, str(e))
            return
        if out:
            ex.chunk(out)

    def complete(self, ex):
        tx = ex.tx
        try:
            out = tx.close()
        except ir.CodecError as e:
            ex.fault(F_MALFORMED, str(e))
            return
        if out:
            ex.chunk(out)
        ex.usage = tx.usage
        if not tx.finished:
            ex.truncated()
            return
        ex.end_attempt(None)
        ex.end_chunks(O_OK)

    def end_event(self, ex, kind, message):
        return ex.tx.error(kind, message)


def _billing_lost(ex):
    """The usage of an answer relayed to the client cannot be read: it is billed zero, and
    busbar_billing_truncated_total says so (the rare path reads the gateway's observability
    objects; a callback of its own on the gateway would slow every other attribute read there)."""
    st = ex.site.observability
    if st is not None and st.metrics is not None:
        st.metrics.billing_lost()


def _tap_events(ex, events):
    for e in events:
        if e.kind == ir.EVENT_ERROR:
            # An error event the upstream sent ends its stream as it meant to: relayed as sent,
            # with any secret masked.
            ex.tap_error = True
