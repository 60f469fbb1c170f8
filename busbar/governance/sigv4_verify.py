"""Bedrock ingress authentication: verifying an AWS Signature Version 4 made with a busbar-issued
AWS credential pair (SPEC §5: "full signature plus `x-amz-content-sha256` body hash, constant time.
An unknown access key id is checked against a dummy secret, so it looks the same as a bad
signature").

boto3's `bedrock-runtime` client, pointed at busbar with `endpoint_url`, signs every Converse call
with service name `bedrock` (the service model's `signingName`) and the headers
`content-type;host;x-amz-date`. The canonical request is rebuilt here exactly as botocore's
`SigV4Auth` builds it (tests/busbar/governance/test_sigv4_verify.py signs with real botocore and
calls through real boto3):

- URI: the request path as received, percent-encoding untouched, then botocore's
  `quote(normalize_url_path(path), safe='/~')`: a model id `...-v1:0` travels as `...-v1%3A0` and is
  signed as `...-v1%253A0` (the same rule as the egress signer, busbar/upstream/sigv4.py).
- query: the `k=v` pairs as received, sorted (botocore's rule for a query taken from the URL).
- headers: exactly the ones the client lists in SignedHeaders (which must be lower-case, sorted,
  unique, and include `host` and `x-amz-date`), values trimmed and inner whitespace collapsed.
- payload: `x-amz-content-sha256` when the client sends it, which must then equal the SHA-256 of
  the body (`UNSIGNED-PAYLOAD` and the streaming forms are refused), else the SHA-256 of the body.

Everything that can be checked without the secret (shape, scope, clock skew, body hash) is checked
first and does not depend on the access key id. Then the secret is looked up; an unknown key id
signs with a per-process dummy secret, so the same HMAC work is done (the derived-key cache
included, see _signing_key) and the same answer (None) comes back as for a wrong signature.
Signatures compare with hmac.compare_digest.

Hostile input never raises: a malformed, oversized or non-ASCII Authorization, date, path or
header gives None. What is processed is capped (see the _MAX_* constants); the server's own header
limits cap the rest.

Limits of the input: busbar's HTTP server keeps the last value of a repeated header, so a request
that repeats a signed header fails verification (botocore never does that). Only `x-amz-date` is
accepted as the request date (botocore always sends it; the `date` header form is not).
"""
from __future__ import annotations

import calendar
import functools
import hashlib
import hmac
import os

from busbar.upstream import sigv4 as _sigv4

_SCHEME = b"AWS4-HMAC-SHA256"
_SERVICE = b"bedrock"
_TERMINATOR = b"aws4_request"

_MAX_AUTHORIZATION = 2048       # botocore's header with 4 signed headers is ~200 bytes
_MAX_SIGNED_HEADERS = 24
_MAX_HEADER_VALUE = 8192
_MAX_CANONICAL_HEADERS = 32768
_MAX_PATH = 8192
_MAX_QUERY = 8192
_MAX_AKID = 128
_MAX_REGION = 64

_HEX = frozenset(b"0123456789abcdef")
_DIGITS = frozenset(b"0123456789")
_REGION_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-")
_HEADER_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")

# An unknown access key id is verified against this secret: fixed for the life of the process,
# never issued to anyone, the same length as an issued secret.
_DUMMY_SECRET = os.urandom(20).hex()

# The canonical-URI rule of the egress signer with a cache of its own: the paths here come from
# clients, and must not evict the egress signer's entries.
_canonical_path = functools.lru_cache(maxsize=256)(_sigv4._canonical_path.__wrapped__)
_canonical_query = _sigv4._canonical_query


@functools.lru_cache(maxsize=1024)
def _signing_key(akid, secret, date, region):
    """The derived SigV4 key of a secret for a day and region. Cached per access key id too, and an
    unknown id caches its dummy-secret key the same way, so the cache behaves identically for a
    known and an unknown id (first use per id, day and region derives; later uses hit). A rotated
    secret is a new entry."""
    k = hmac.digest(b"AWS4" + (secret.encode() if isinstance(secret, str) else secret), date,
                    "sha256")
    k = hmac.digest(k, region, "sha256")
    k = hmac.digest(k, _SERVICE, "sha256")
    return hmac.digest(k, _TERMINATOR, "sha256")


def _parse_authorization(value):
    """(akid, date, region, signed_headers, signature) as bytes, or None."""
    if len(value) > _MAX_AUTHORIZATION or not value.startswith(_SCHEME + b" "):
        return None
    fields = {}
    for part in value[len(_SCHEME) + 1:].split(b","):
        k, eq, v = part.strip().partition(b"=")
        if not eq or k in fields:
            return None
        fields[k] = v
    if len(fields) != 3:
        return None
    cred = fields.get(b"Credential")
    signed = fields.get(b"SignedHeaders")
    sig = fields.get(b"Signature")
    if cred is None or signed is None or sig is None:
        return None
    scope = cred.split(b"/")
    if len(scope) != 5:
        return None
    akid, date, region, service, terminator = scope
    if (not akid or len(akid) > _MAX_AKID or not akid.isalnum() or not akid.isascii()
            or len(date) != 8 or not _DIGITS.issuperset(date)
            or not region or len(region) > _MAX_REGION or not _REGION_CHARS.issuperset(region)
            or service != _SERVICE or terminator != _TERMINATOR
            or len(sig) != 64 or not _HEX.issuperset(sig)):
        return None
    return akid, date, region, signed, sig


def _amz_time(v):
    """Seconds since the epoch of an `x-amz-date` (`YYYYMMDDTHHMMSSZ`), or None."""
    if (len(v) != 16 or v[8] != 84 or v[15] != 90          # 'T', 'Z'
            or not _DIGITS.issuperset(v[:8]) or not _DIGITS.issuperset(v[9:15])):
        return None
    y, mo, d = int(v[:4]), int(v[4:6]), int(v[6:8])
    h, mi, s = int(v[9:11]), int(v[11:13]), int(v[13:15])
    if not (1970 <= y and 1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and s <= 60):
        return None
    return calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))


def _text(v):
    """A path or query as str (the server hands them over as ASCII str; bytes are accepted)."""
    if isinstance(v, str):
        return v if v.isascii() else None
    if isinstance(v, (bytes, bytearray)):
        b = bytes(v)
        return b.decode("ascii") if b.isascii() else None
    return None


def verify(method: bytes, path: str, query: str, headers: dict[bytes, bytes], body: bytes,
           secret_for, now: float, max_skew_secs: float = 300) -> str | None:
    """The access key id of a request carrying a valid SigV4 signature, else None.

    method: the request method (b"POST"). path, query: the request target split at the first `?`,
    percent-encoding untouched, without the `?` ("" when there is none) — as busbar.server.http's
    Request holds them (ASCII str; bytes are accepted too). headers: lower-case byte names to byte
    values. body: the exact bytes received. secret_for(akid: str) -> str | None: the secret access
    key of an issued access key id, None when unknown (exceptions it raises propagate). now: the
    current time, seconds since the epoch; x-amz-date must be within max_skew_secs of it.
    """
    auth = headers.get(b"authorization")
    amz_date = headers.get(b"x-amz-date")
    if auth is None or amz_date is None or not isinstance(method, bytes) or len(method) > 16:
        return None
    parsed = _parse_authorization(auth)
    if parsed is None:
        return None
    akid, date, region, signed, sig = parsed

    t = _amz_time(amz_date)
    if t is None or amz_date[:8] != date or not abs(now - t) <= max_skew_secs:
        return None

    # SignedHeaders: sorted, unique, lower-case token names, host and x-amz-date among them, each
    # present in the request. The canonical header block is built from them.
    names = signed.split(b";")
    if len(names) > _MAX_SIGNED_HEADERS or b"host" not in names or b"x-amz-date" not in names:
        return None
    canon = []
    size = 0
    prev = b""
    for name in names:
        if name <= prev or not _HEADER_NAME_CHARS.issuperset(name):
            return None
        prev = name
        v = headers.get(name)
        if v is None or len(v) > _MAX_HEADER_VALUE:
            return None
        line = name + b":" + b" ".join(v.split()) + b"\n"
        size += len(line)
        if size > _MAX_CANONICAL_HEADERS:
            return None
        canon.append(line)

    payload_hash = hashlib.sha256(body).hexdigest().encode()
    claimed = headers.get(b"x-amz-content-sha256")
    if claimed is not None and not hmac.compare_digest(claimed, payload_hash):
        return None      # also UNSIGNED-PAYLOAD and STREAMING-*: the body must be signed

    p = _text(path)
    q = _text(query)
    if p is None or q is None or len(p) > _MAX_PATH or len(q) > _MAX_QUERY:
        return None
    canonical_request = b"\n".join((
        method.upper(), _canonical_path(p).encode(), _canonical_query(q).encode(),
        b"".join(canon), signed, payload_hash))
    scope = date + b"/" + region + b"/" + _SERVICE + b"/" + _TERMINATOR
    string_to_sign = (_SCHEME + b"\n" + amz_date + b"\n" + scope + b"\n" +
                      hashlib.sha256(canonical_request).hexdigest().encode())

    key_id = akid.decode("ascii")
    secret = secret_for(key_id)
    known = bool(secret)
    want = hmac.digest(_signing_key(akid, secret if known else _DUMMY_SECRET, date, region),
                       string_to_sign, "sha256").hex().encode()
    if hmac.compare_digest(want, sig) and known:
        return key_id
    return None
