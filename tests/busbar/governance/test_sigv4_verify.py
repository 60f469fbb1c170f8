"""busbar.governance.sigv4_verify against requests signed by real botocore (SigV4Auth, the signer
boto3 uses) and against boto3's bedrock-runtime client itself over HTTP."""
import datetime
import hashlib
import http.server
import json
import threading
from unittest import mock
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given, settings, strategies as st

from busbar.governance import sigv4_verify
from busbar.governance.sigv4_verify import verify

AKID = "BBAK0123456789ABCDEF"
SECRET = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXg="
OTHER = "BBAKFEDCBA9876543210"
WHEN = datetime.datetime(2024, 5, 1, 12, 0, 0)
NOW = 1714564800.0          # 2024-05-01T12:00:00Z
HOST = "127.0.0.1:8080"
BODY = b'{"messages":[{"role":"user","content":[{"text":"h\\u00e9"}]}]}'

MODELS = [
    "anthropic.claude-3-haiku-20240307-v1:0",
    "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-1-70b-instruct-v1:0",
    "amazon.nova-lite-v1:0",
]


def secrets(akid):
    return {AKID: SECRET}.get(akid)


def signed(model, op="converse", body=BODY, secret=SECRET, akid=AKID, sha_header=False,
           query="", when=WHEN, region="us-east-1", service="bedrock", extra=None):
    """A request as botocore signs it and as busbar's server would hand it over:
    (method, path, query, headers with lower-case byte names, body)."""
    # boto3 puts modelId in the path as a URI label: every reserved character percent-encoded.
    path = "/model/" + quote(model, safe="") + "/" + op
    url = "http://" + HOST + path + ("?" + query if query else "")
    hdrs = {"Content-Type": "application/json"}
    if sha_header:
        hdrs["X-Amz-Content-SHA256"] = hashlib.sha256(body).hexdigest()
    hdrs.update(extra or {})
    req = AWSRequest("POST", url, data=body, headers=hdrs)
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        SigV4Auth(Credentials(akid, secret), service, region).add_auth(req)
    headers = {k.lower().encode(): v.encode() if isinstance(v, str) else v
               for k, v in req.headers.items()}
    headers[b"host"] = HOST.encode()
    headers[b"content-length"] = str(len(body)).encode()
    parts = urlsplit(url)
    return b"POST", parts.path, parts.query, headers, body


def check(req, now=NOW, secret_for=secrets, **kw):
    method, path, query, headers, body = req
    return verify(method, path, query, headers, body, secret_for, now, **kw)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("op", ["converse", "converse-stream"])
@pytest.mark.parametrize("sha_header", [False, True])
def test_botocore_signature_verifies(model, op, sha_header):
    req = signed(model, op, sha_header=sha_header)
    assert (b"x-amz-content-sha256" in req[3]) == sha_header
    assert "%3A" in req[1]
    if "/" in model:
        assert "%2F" in req[1]
    assert check(req) == AKID


def test_path_is_double_encoded_when_signing():
    # The signature covers `%253A`; verifying the decoded path (`:`) must not pass.
    method, path, query, headers, body = signed(MODELS[0])
    assert verify(method, path.replace("%3A", ":"), query, headers, body, secrets, NOW) is None


def test_query_string_and_bytes_target():
    method, path, query, headers, body = signed(MODELS[0], query="b=2&a=1&a=0")
    assert verify(method, path, query, headers, body, secrets, NOW) == AKID
    # bytes path/query are accepted as well
    assert verify(method, path.encode(), query.encode(), headers, body, secrets, NOW) == AKID
    assert verify(method, path, "a=1", headers, body, secrets, NOW) is None


def test_empty_body_and_other_region():
    assert check(signed(MODELS[3], body=b"", region="eu-west-3")) == AKID
    assert check(signed(MODELS[3], body=b"", sha_header=True)) == AKID


def test_extra_signed_headers():
    req = signed(MODELS[0], extra={"X-Amz-Security-Token": "tok", "X-Custom": "a   b\t c "})
    assert b"x-custom" in req[3][b"authorization"]
    assert check(req) == AKID


def test_wrong_secret():
    assert check(signed(MODELS[0], secret="not-the-secret")) is None


def test_unknown_akid_is_checked_against_the_dummy_secret():
    calls = []

    def lookup(akid):
        calls.append(akid)
        return secrets(akid)

    unknown = signed(MODELS[0], akid=OTHER)
    bad = signed(MODELS[0], secret="bad")
    dummy = signed(MODELS[0], akid=OTHER, secret=sigv4_verify._DUMMY_SECRET)

    def digests(req):
        with mock.patch.object(sigv4_verify.hmac, "digest", wraps=sigv4_verify.hmac.digest) as d:
            assert check(req, secret_for=lookup) is None
        return d.call_count

    # The same HMAC work for an unknown id as for a bad signature, the derived-key cache included:
    # 4 derivations + the signature on first use of an id (per day and region), then 1.
    sigv4_verify._signing_key.cache_clear()
    assert [digests(unknown), digests(bad), digests(unknown), digests(bad)] == [5, 5, 1, 1]
    # Even signed with the dummy secret itself, an unknown key id never verifies.
    assert digests(dummy) == 1
    assert calls == [OTHER, AKID, OTHER, AKID, OTHER]
    # An empty secret from the store counts as unknown.
    assert check(signed(MODELS[0], secret=""), secret_for=lambda a: "") is None


def test_rotated_secret_is_not_served_from_the_key_cache():
    req = signed(MODELS[0])
    assert check(req) == AKID
    assert check(req, secret_for=lambda a: "rotated") is None
    assert check(signed(MODELS[0], secret="rotated"), secret_for=lambda a: "rotated") == AKID


def test_tampered_body():
    method, path, query, headers, body = signed(MODELS[0])
    assert verify(method, path, query, headers, body + b" ", secrets, NOW) is None
    assert verify(method, path, query, headers, body.replace(b"user", b"usex"), secrets, NOW) is None


def test_body_hash_header_must_match_the_body():
    method, path, query, headers, body = signed(MODELS[0], sha_header=True)
    assert verify(method, path, query, headers, body + b"x", secrets, NOW) is None
    for claimed in (b"UNSIGNED-PAYLOAD", b"STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                    hashlib.sha256(body).hexdigest().upper().encode(), b"", b"\xff" * 64):
        h = {**headers, b"x-amz-content-sha256": claimed}
        assert verify(method, path, query, h, body, secrets, NOW) is None
    # A client that signed UNSIGNED-PAYLOAD (an unsigned body) is refused even with the header.
    method, path, query, headers, body = signed(MODELS[0], extra={
        "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    assert verify(method, path, query, headers, body, secrets, NOW) is None
    # Added after signing (unsigned header), but equal to the body hash: the signature still holds.
    method, path, query, headers, body = signed(MODELS[0])
    h = {**headers, b"x-amz-content-sha256": hashlib.sha256(body).hexdigest().encode()}
    assert verify(method, path, query, h, body, secrets, NOW) == AKID


def test_tampered_path():
    method, path, query, headers, body = signed(MODELS[0])
    other = path.replace("haiku", "opus")
    assert verify(method, other, query, headers, body, secrets, NOW) is None
    assert verify(method, path.replace("converse", "converse-stream"), query, headers, body,
                  secrets, NOW) is None
    assert verify(b"PUT", path, query, headers, body, secrets, NOW) is None


def test_tampered_signed_header():
    method, path, query, headers, body = signed(MODELS[0])
    for name, value in ((b"content-type", b"text/plain"), (b"host", b"evil.example:8080"),
                        (b"x-amz-date", b"20240501T120001Z")):
        h = {**headers, name: value}
        assert verify(method, path, query, h, body, secrets, NOW) is None
    # An unsigned header may change.
    h = {**headers, b"user-agent": b"something-else"}
    assert verify(method, path, query, h, body, secrets, NOW) == AKID


def test_stale_or_future_date():
    req = signed(MODELS[0])
    assert check(req, now=NOW + 299) == AKID
    assert check(req, now=NOW - 299) == AKID
    assert check(req, now=NOW + 301) is None
    assert check(req, now=NOW - 301) is None
    assert check(req, now=NOW + 3000, max_skew_secs=3600) == AKID
    assert check(req, now=float("nan")) is None


def test_credential_date_must_match_x_amz_date():
    method, path, query, headers, body = signed(MODELS[0])
    auth = headers[b"authorization"].replace(b"/20240501/", b"/20240502/")
    h = {**headers, b"authorization": auth}
    assert verify(method, path, query, h, body, secrets, NOW) is None


@pytest.mark.parametrize("drop", [b"authorization", b"x-amz-date", b"host", b"content-type"])
def test_missing_headers(drop):
    method, path, query, headers, body = signed(MODELS[0])
    h = {k: v for k, v in headers.items() if k != drop}
    assert verify(method, path, query, h, body, secrets, NOW) is None


def test_service_must_be_bedrock():
    assert check(signed(MODELS[0], service="bedrock-runtime")) is None
    assert check(signed(MODELS[0], service="s3")) is None


def _with_auth(auth):
    method, path, query, headers, body = signed(MODELS[0])
    return method, path, query, {**headers, b"authorization": auth}, body


GOOD_AUTH = signed(MODELS[0])[3][b"authorization"]


@pytest.mark.parametrize("auth", [
    b"",
    b"Bearer bbk_abc.def",
    b"AWS4-HMAC-SHA256",
    b"AWS4-HMAC-SHA256 ",
    b"AWS4-HMAC-SHA256 Credential=, SignedHeaders=, Signature=",
    b"AWS4-HMAC-SHA1 " + GOOD_AUTH[17:],
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=content-type;x-amz-date"),           # host not signed
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=content-type;host"),                 # date not signed
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=host;content-type;x-amz-date"),      # not sorted
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=content-type;host;host;x-amz-date"),  # repeated
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=content-type;host;x-absent;x-amz-date"),
    GOOD_AUTH.replace(b"SignedHeaders=content-type;host;x-amz-date",
                      b"SignedHeaders=Content-Type;host;x-amz-date"),
    GOOD_AUTH.replace(b"/aws4_request", b"/aws4_request/x"),
    GOOD_AUTH.replace(b"/aws4_request", b"/aws5_request"),
    GOOD_AUTH.replace(b"/us-east-1/", b"/US-EAST-1/"),
    GOOD_AUTH.replace(b"/us-east-1/", b"//"),
    GOOD_AUTH.replace(b"Credential=" + AKID.encode(), b"Credential=BBAK\xc3\xa9"),
    GOOD_AUTH.replace(b"Credential=" + AKID.encode(), b"Credential="),
    GOOD_AUTH.replace(b"Credential=" + AKID.encode(), b"Credential=" + b"A" * 200),
    GOOD_AUTH + b", Signature=" + b"0" * 64,                               # repeated field
    GOOD_AUTH + b", Extra=1",
    GOOD_AUTH[:-1],                                                        # 63 hex digits
    GOOD_AUTH[:-64] + GOOD_AUTH[-64:].upper(),
    GOOD_AUTH[:-64] + b"z" * 64,
    GOOD_AUTH + b" " * 3000,
    b"\xff\xfe\x00" * 100,
    b"AWS4-HMAC-SHA256 " + b",=" * 1000,
    b"AWS4-HMAC-SHA256 Credential=a/b/c/d/e/f/g, SignedHeaders=host, Signature=x",
])
def test_garbage_authorization(auth):
    method, path, query, headers, body = _with_auth(auth)
    assert verify(method, path, query, headers, body, secrets, NOW) is None


@pytest.mark.parametrize("date", [b"", b"20240501", b"20240501T120000", b"20240501t120000Z",
                                  b"2024-05-01T12:00:00Z", b"20241301T120000Z",
                                  b"00000101T000000Z", b"20240501T250000Z", b"\xff" * 16,
                                  b"20240501T12000\xd9\xa0Z"])
def test_garbage_date(date):
    method, path, query, headers, body = signed(MODELS[0])
    h = {**headers, b"x-amz-date": date}
    assert verify(method, path, query, h, body, secrets, NOW) is None


def test_hostile_path_query_and_values():
    method, path, query, headers, body = signed(MODELS[0])
    for p, q in (("/model/é/converse", ""), (path, "a=é"), (b"/\xff", ""), ("/" + "a" * 20000, ""),
                 (path, "a=" + "b" * 20000), (None, ""), (path, None)):
        assert verify(method, p, q, headers, body, secrets, NOW) is None
    h = {**headers, b"content-type": b"x" * 100000}
    assert verify(method, path, query, h, body, secrets, NOW) is None
    h = {**headers, b"content-type": b"application/json\xff"}
    assert verify(method, path, query, h, body, secrets, NOW) is None
    assert verify(b"P" * 100, path, query, headers, body, secrets, NOW) is None
    assert verify("POST", path, query, headers, body, secrets, NOW) is None


@settings(max_examples=300, deadline=None)
@given(auth=st.binary(max_size=300), date=st.binary(max_size=20), path=st.text(max_size=40),
       query=st.text(max_size=20), names=st.lists(st.binary(max_size=12), max_size=5))
def test_fuzz_never_raises(auth, date, path, query, names):
    headers = {b"authorization": auth, b"x-amz-date": date, b"host": b"h"}
    for n in names:
        headers[n] = n
    assert verify(b"POST", path, query, headers, b"{}", secrets, NOW) is None
    # Structured garbage: a well-formed header with fuzzed parts.
    a = (b"AWS4-HMAC-SHA256 Credential=" + AKID.encode() + b"/20240501/us-east-1/bedrock/"
         b"aws4_request, SignedHeaders=" + b";".join(sorted(set(names))) + b", Signature=" +
         hashlib.sha256(auth).hexdigest().encode())
    headers[b"authorization"] = a
    headers[b"x-amz-date"] = b"20240501T120000Z"
    assert verify(b"POST", path, query, headers, b"{}", secrets, NOW) is None


# ------------------------------------------------------------------ through boto3 itself

CONVERSE = json.dumps({
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn", "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
    "metrics": {"latencyMs": 1}}).encode()


@pytest.fixture
def verifying_server():
    import time
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            path, _, query = self.path.partition("?")
            headers = {k.lower().encode("latin-1"): v.encode("latin-1")
                       for k, v in self.headers.items()}
            akid = verify(self.command.encode(), path, query, headers, body, secrets, time.time())
            seen.append((path, akid))
            if akid is None:
                out = b'{"message":"The request signature we calculated does not match."}'
                self.send_response(403)
                self.send_header("x-amzn-ErrorType", "AccessDeniedException")
            else:
                out = CONVERSE
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield "http://127.0.0.1:%d" % srv.server_address[1], seen
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def _client(url, secret, monkeypatch):
    import boto3
    from botocore.config import Config
    # Make boto3 sign with the credential pair, never a bearer token from the environment.
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)
    return boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=url,
                        aws_access_key_id=AKID, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 1}))


def test_boto3_converse_is_verified(verifying_server, monkeypatch):
    url, seen = verifying_server
    client = _client(url, SECRET, monkeypatch)
    for model in (MODELS[0], MODELS[2]):
        r = client.converse(modelId=model,
                            messages=[{"role": "user", "content": [{"text": "hé"}]}])
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert r["output"]["message"]["content"] == [{"text": "hi"}]
    assert [a for _, a in seen] == [AKID, AKID]
    assert "%3A" in seen[0][0] and "%2F" in seen[1][0]


def test_boto3_wrong_secret_fails_verification(verifying_server, monkeypatch):
    from botocore.exceptions import ClientError
    url, seen = verifying_server
    client = _client(url, "wrong-secret", monkeypatch)
    with pytest.raises(ClientError) as exc:
        client.converse(modelId=MODELS[0], messages=[{"role": "user", "content": [{"text": "x"}]}])
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert seen == [("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", None)]
