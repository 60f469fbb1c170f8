"""AWS Signature Version 4 for Bedrock egress: a lean signer for the hot path.

Signs exactly what botocore's SigV4Auth signs for bedrock-runtime (checked byte for byte in
tests/busbar/upstream/test_sigv4.py), minus botocore's per-request object churn: the derived
signing key is cached for the UTC day it is valid for, and the scope strings are built once.

Headers signed: host and x-amz-date, x-amz-security-token with temporary credentials, and
content-type when the caller passes the value it sends (boto3 signs `content-type;host;x-amz-date`;
AWS accepts any superset of host + x-amz-date). No x-amz-content-sha256: botocore adds it only
for S3, Bedrock does not ask for it.

The canonical URI is the request path as sent on the wire, percent-encoded once more: a model id
`anthropic.claude-3-5-sonnet-20241022-v2:0` travels as `...v2%3A0` and is signed as `...v2%253A0`
(botocore's `quote(normalize_url_path(path), safe='/~')`).
"""
import functools
import hashlib
import hmac
import time
from urllib.parse import quote

# The request's HMAC through OpenSSL's one-shot call, as hmac.digest makes it, without the Python
# function around it: this module is compiled (sigv4.pxd) so that a Bedrock request runs no
# bytecode (see SigV4Signer.sign).
from _hashlib import hmac_digest as _hmac_digest

ALGORITHM = "AWS4-HMAC-SHA256"
_AMZ_DATE = "%Y%m%dT%H%M%SZ"


# A lane signs the same few paths over and over (one per model and stream flag): quote() is the
# slowest step of a signature, so its result is kept.
@functools.lru_cache(maxsize=1024)
def _canonical_path(path):
    """botocore.utils.normalize_url_path, then quote(safe='/~'): dot segments and empty segments
    (`//`) go, a trailing slash stays, and every `%` of the wire path becomes `%25`."""
    if not path:
        return "/"
    parts = []
    for seg in path.split("/"):
        if not seg or seg == ".":
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    norm = ("/" if path[0] == "/" else "") + "/".join(parts)
    if path[-1] == "/" and parts:
        norm += "/"
    return quote(norm, safe="/~")


def _canonical_query(query):
    """botocore's rule for a query string taken from the URL: the pairs as sent, sorted."""
    if not query:
        return ""
    pairs = sorted(pair.partition("=")[::2] for pair in query.split("&"))
    return "&".join(k + "=" + v for k, v in pairs)


def _trim(value):
    # SigV4 "Trimall": strip, and collapse runs of whitespace to one space.
    return " ".join(value.split())


class SigV4Signer:
    """Signs requests for one credential in one region and service."""

    __slots__ = ("access_key", "region", "service", "_secret", "_token", "_scope_tail",
                 "_day", "_key", "_sec", "_amz")

    def __init__(self, access_key, secret_key, session_token=None, region=None, service="bedrock"):
        if not access_key or not secret_key:
            raise ValueError("SigV4 needs an access key id and a secret access key")
        if not region:
            raise ValueError("SigV4 needs a region")
        self.access_key = access_key
        self.region = region
        self.service = service
        self._secret = ("AWS4" + secret_key).encode()
        self._token = session_token or None
        self._scope_tail = "/" + region + "/" + service + "/aws4_request"
        self._day = None
        self._key = None
        self._sec = -1          # the second self._amz was formatted for
        self._amz = None

    def __repr__(self):
        # Never the secret or the token: this object ends up in logs and tracebacks.
        return "SigV4Signer(%r, region=%r, service=%r)" % (self.access_key, self.region, self.service)

    def _signing_key(self, day):
        if day != self._day:
            k = hmac.digest(self._secret, day.encode(), "sha256")
            k = hmac.digest(k, self.region.encode(), "sha256")
            k = hmac.digest(k, self.service.encode(), "sha256")
            self._key = hmac.digest(k, b"aws4_request", "sha256")
            self._day = day
        return self._key

    def sign(self, method, host, path, query, body, amz_date=None, content_type=None):
        """The headers to add to this request: [(name, value), ...] with X-Amz-Date,
        X-Amz-Security-Token (temporary credentials only) and Authorization.

        host: the Host header as sent (with the port when it is not the scheme's default).
        path: percent-encoded exactly as sent on the wire. query: as sent, without the `?`.
        body: the exact bytes sent. amz_date: `YYYYMMDDTHHMMSSZ`, default now (UTC).
        content_type: when given, signed as the Content-Type the caller sends (as boto3 does).
        """
        if amz_date is None:
            # Formatted once a second: strftime and gmtime parse their arguments and consult the
            # locale, the largest part of a signature's code after the hashing.
            sec = int(time.time())
            if sec != self._sec:
                self._amz = time.strftime(_AMZ_DATE, time.gmtime(sec))
                self._sec = sec
            amz_date = self._amz
        day = amz_date[:8]
        if content_type is not None:
            headers = "content-type:" + _trim(content_type) + "\nhost:" + _trim(host)
            signed = "content-type;host;x-amz-date"
        else:
            headers = "host:" + _trim(host)
            signed = "host;x-amz-date"
        headers += "\nx-amz-date:" + amz_date + "\n"
        if self._token is not None:
            headers += "x-amz-security-token:" + _trim(self._token) + "\n"
            signed += ";x-amz-security-token"
        canonical = "\n".join((
            method.upper(), _canonical_path(path), _canonical_query(query), headers, signed,
            hashlib.sha256(body).hexdigest()))
        scope = day + self._scope_tail
        to_sign = ALGORITHM + "\n" + amz_date + "\n" + scope + "\n" + \
            hashlib.sha256(canonical.encode()).hexdigest()
        signature = _hmac_digest(self._signing_key(day), to_sign.encode(), "sha256").hex()
        out = [("X-Amz-Date", amz_date)]
        if self._token is not None:
            out.append(("X-Amz-Security-Token", self._token))
        out.append(("Authorization", ALGORITHM + " Credential=" + self.access_key + "/" + scope +
                    ", SignedHeaders=" + signed + ", Signature=" + signature))
        return out


def parse_credential(secret):
    """Splits a lane credential "ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]" into
    (access, secret, token or None). Raises ValueError (without echoing the secret) otherwise."""
    if not isinstance(secret, str):
        raise ValueError("a Bedrock credential must be a string ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]")
    parts = secret.strip().split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ValueError("a Bedrock credential must look like ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN]")
    token = parts[2] if len(parts) == 3 and parts[2] else None
    return parts[0], parts[1], token


def region_from_host(host):
    """The region of a bedrock-runtime endpoint host (`bedrock-runtime.us-east-1.amazonaws.com`,
    the `-fips` variant, `.amazonaws.com.cn`, or a VPC endpoint `vpce-….bedrock-runtime.<region>
    .vpce.amazonaws.com`); None when the host is not one (the lane must then name its region)."""
    if not host:
        return None
    host = host.strip().lower()
    if host.startswith("["):
        return None
    labels = host.rsplit(":", 1)[0].split(".") if host.count(":") == 1 else host.split(".")
    for i in range(len(labels) - 2):
        if labels[i] in ("bedrock-runtime", "bedrock-runtime-fips") and labels[i + 1]:
            return labels[i + 1]
    return None
