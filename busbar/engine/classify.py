"""Fault classification (SPEC §4.1): what an attempt's ending means for the lane and the request.

Stage 1 reads the upstream's answer with the lane protocol's own error reader (`codec.
read_error_detail(body) -> (message, code)`: OpenAI `error.code`, Anthropic `error.type`, Gemini
`error.status`, Cohere a code if any, Bedrock `__type`) and the Retry-After headers. Stage 1b names
the error class: the provider's `error_map` (the catalog's merged with the provider's own; see
`map_signals` for what it is matched against), then the built-in context-length and billing
signatures, then the status. Stage 2 maps the class to a disposition:

  transient_upstream  rate limits, overload, 5xx, network faults: penalise, cool down, fail over
  attempt_timeout     the attempt's own deadline passed: the same, under its own name (metrics)
  hard_down           busbar's configured key refused (auth, billing): bench the lane, fail over
  client_fault        the caller's request is wrong: relay, no penalty
  context_length      the prompt is too long for this lane: no penalty, try a larger lane

Nothing here runs on a 2xx: the happy path never classifies.

In the engine because it is the attempt's vocabulary: the exchange classifies a failed attempt
and decides from the disposition whether to fail over; reliability (breaker cells, health
probes) reads the dispositions the engine wrote, so the arrow points from reliability to here.
"""
from __future__ import annotations

import re
import time

from cbusbar.proto import codec

from busbar.engine.records import (F_CANCELLED, F_CONNECT, F_CREDENTIALS, F_INTERNAL, F_MALFORMED,
                                   F_PROTOCOL, F_REFUSED, F_RESET, F_STATUS, F_TIMEOUT, F_TRUNCATED)

D_TRANSIENT = "transient_upstream"
D_ATTEMPT_TIMEOUT = "attempt_timeout"
D_HARD_DOWN = "hard_down"
D_CLIENT_FAULT = "client_fault"
D_CONTEXT = "context_length"

# Dispositions that count against the lane and are worth another lane.
PENALISED = frozenset((D_TRANSIENT, D_ATTEMPT_TIMEOUT, D_HARD_DOWN))
FAIL_OVER = frozenset((D_TRANSIENT, D_ATTEMPT_TIMEOUT, D_HARD_DOWN, D_CONTEXT))

# Faults that are not an HTTP status: every one before a usable answer is the lane's (a malformed
# or truncated 2xx included); cancelled, refused, missing credentials and busbar's own bugs are not.
FAULT_DISPOSITION = {
    F_CONNECT: D_TRANSIENT,
    F_RESET: D_TRANSIENT,
    F_PROTOCOL: D_TRANSIENT,
    F_MALFORMED: D_TRANSIENT,
    F_TRUNCATED: D_TRANSIENT,
    F_TIMEOUT: D_ATTEMPT_TIMEOUT,
    F_CANCELLED: None,
    F_REFUSED: None,
    F_CREDENTIALS: None,
    F_INTERNAL: None,
    F_STATUS: None,         # classified from the answer (classify_status)
}

CLASS_DISPOSITION = {
    "rate_limit": D_TRANSIENT,
    "overloaded": D_TRANSIENT,
    "server_error": D_TRANSIENT,
    "timeout": D_TRANSIENT,
    "network": D_TRANSIENT,
    "auth": D_HARD_DOWN,
    "billing": D_HARD_DOWN,
    "client_error": D_CLIENT_FAULT,
    "context_length": D_CONTEXT,
}

# Built-in signatures, each from the vendor's documented or observed error body:
# OpenAI/Responses/Azure `code: context_length_exceeded` ("This model's maximum context length is
# 8192 tokens..."); Anthropic 400 invalid_request_error "prompt is too long: 208310 tokens > 200000
# maximum"; Gemini 400 INVALID_ARGUMENT "The input token count (1200000) exceeds the maximum number
# of tokens allowed (1048576)."; Cohere 400 "too many tokens: ..."; Bedrock ValidationException
# "Input is too long for requested model." Honoured only on 400/413 (SPEC §4.1).
CONTEXT_CODES = frozenset(("context_length_exceeded", "string_above_max_length"))
CONTEXT_TEXT = re.compile(
    r"maximum context length|context window|prompt is too long|input is too long|too many tokens"
    r"|input token count .*exceeds|too many input tokens", re.IGNORECASE)
# Billing: OpenAI 429 `insufficient_quota`; Anthropic 400 "Your credit balance is too low";
# HTTP 402 wherever it is used. A 429 that is billing must not be retried in 30 s: it is benched.
BILLING_CODES = frozenset(("insufficient_quota", "billing_hard_limit_reached", "billing_not_active"))
BILLING_TEXT = re.compile(r"credit balance is too low", re.IGNORECASE)
# Gemini answers a wrong API key with 400 INVALID_ARGUMENT "API key not valid" (not 401): without
# this a lane with a bad key would look like the caller's mistake.
AUTH_TEXT = re.compile(r"API key not valid|API_KEY_INVALID")


class Fault:
    """A classified upstream answer: disposition, error class, provider code, Retry-After (s)."""

    __slots__ = ("disposition", "cls", "code", "retry_after", "message")

    def __init__(self, disposition, cls, code=None, retry_after=None, message=None):
        self.disposition = disposition
        self.cls = cls
        self.code = code
        self.retry_after = retry_after
        self.message = message

    def __repr__(self):
        return "<Fault %s %s code=%r retry_after=%r>" % (self.disposition, self.cls, self.code,
                                                         self.retry_after)


def retry_after(headers, now: float | None = None) -> float | None:
    """Seconds from `Retry-After` (delta-seconds or an HTTP-date, RFC 9110 §10.2.3) or OpenAI's
    `retry-after-ms`; None when absent or unreadable."""
    ms = None
    ra = None
    for k, v in headers:
        if k == b"retry-after":
            ra = v
        elif k == b"retry-after-ms":
            ms = v
    if ms is not None:
        try:
            x = float(ms) / 1000.0
            if x >= 0:
                return x
        except ValueError:
            pass
    if ra is None:
        return None
    try:
        x = float(ra)
        return x if x >= 0 and x == x else None
    except ValueError:
        pass
    try:
        when = _http_date(ra.decode("latin-1"))
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when - (time.time() if now is None else now))


_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
# RFC 9110 §5.6.7 IMF-fixdate, the form senders must use: "Sun, 06 Nov 1994 08:49:37 GMT".
# (email.utils would parse the obsolete forms too, but the single-file executable leaves `email`
# out; a Retry-After in another form is ignored, i.e. no floor.)
_IMF = re.compile(r"\s*[A-Za-z]{3}, (\d{2}) ([A-Za-z]{3}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT\s*\Z")


def _http_date(text: str):
    m = _IMF.match(text)
    if m is None:
        return None
    month = _MONTHS.get(m.group(2).lower())
    if month is None:
        return None
    from calendar import timegm  # the rare HTTP-date form: not kept in memory for it (~0.2 MiB)
    return float(timegm((int(m.group(3)), month, int(m.group(1)), int(m.group(4)),
                         int(m.group(5)), int(m.group(6)), 0, 0, 0)))


def map_signals(protocol: str, body: bytes) -> list:
    """What an `error_map` is matched against, in order, as the protocol's codec reads its error
    body (`error_signals`: the provider's error code, then its error type). Read only for a
    provider that has a map."""
    import orjson
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    return codec(protocol).error_signals(doc)


def error_class(status: int, code, message, error_map=(), signals=None) -> str:
    """Stage 1b: the error class of a non-2xx answer. `signals`: what the error_map is matched
    against, in order (default: the codec's code alone)."""
    if error_map:
        for signal in (code,) if signals is None else signals:
            for c, cls in error_map:
                if c == signal:
                    if cls == "context_length" and status >= 500:
                        break   # never a context-length on a 5xx (SPEC §4.1): the next signal
                    return cls
    if status == 400 or status == 413:
        if code in CONTEXT_CODES or (message and CONTEXT_TEXT.search(message)):
            return "context_length"
    if code in BILLING_CODES or status == 402 or (
            status < 500 and message and BILLING_TEXT.search(message)):
        return "billing"
    if status == 401 or status == 403:
        return "auth"
    if status == 400 and message and AUTH_TEXT.search(message):
        return "auth"
    if status == 429:
        return "rate_limit"
    if status == 408:
        return "timeout"
    if status == 529:
        return "overloaded"
    if status >= 500 or status < 400:
        # A 3xx (busbar follows no redirects) is the lane misbehaving, as a 5xx is.
        return "server_error"
    return "client_error"


def classify_status(codec, status: int, headers, body: bytes, provider,
                    passthrough: bool = False) -> Fault:
    """Stages 1 and 2 for a non-2xx answer of `provider` read with its protocol's `codec`.
    `passthrough`: the request carried the caller's own key (its pool's upstream_credentials),
    as every request to a provider with upstream_credentials: passthrough does."""
    message, code = codec.read_error_detail(body) if body else (None, None)
    if code is not None and not isinstance(code, str):
        code = str(code)
    signals = None
    if provider.error_map and body:
        signals = map_signals(provider.protocol, body)
        if code is not None and code not in signals:
            signals.append(code)
    cls = error_class(status, code, message, provider.error_map, signals)
    d = CLASS_DISPOSITION[cls]
    if d == D_HARD_DOWN and (passthrough or provider.upstream_credentials == "passthrough"):
        # The caller's own key failed: theirs to fix, relayed, the lane untouched (SPEC §4.1).
        d = D_CLIENT_FAULT
    return Fault(d, cls, code, retry_after(headers), message)
