"""Loopback stand-ins for what busbar talks to besides model APIs, and a recording upstream:
a fake STS (AssumeRole, AssumeRoleWithWebIdentity), an ECS-style container credentials endpoint,
an EC2 instance metadata service (IMDSv2: a session token first, then the role's credentials), a
Google OAuth2 token endpoint (JWT bearer grant, the assertion verified), and canned model replies
per path. Every request is recorded (method, path, headers, body) for the tests to check.
"""
from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
import urllib.parse

OPENAI_REPLY = {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "up",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello from upstream"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
ANTHROPIC_REPLY = {"id": "msg_up", "type": "message", "role": "assistant", "model": "up",
                   "content": [{"type": "text", "text": "hello from upstream"}],
                   "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": 3, "output_tokens": 2}}
GEMINI_REPLY = {"candidates": [{"content": {"role": "model", "parts": [{"text": "hello from upstream"}]},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5},
                "modelVersion": "up"}
CONVERSE_REPLY = {"output": {"message": {"role": "assistant", "content": [{"text": "hello from upstream"}]}},
                  "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
                  "metrics": {"latencyMs": 1}}

GEMINI_STREAM = (
    b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"hello "}]},"index":0}]}\r\n\r\n'
    b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"stream"}]},"finishReason":"STOP",'
    b'"index":0}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":2,"totalTokenCount":5}}\r\n\r\n')
ANTHROPIC_STREAM = b"".join(b"event: %s\ndata: %s\n\n" % (e.encode(), json.dumps(d).encode()) for e, d in (
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_up", "type": "message", "role": "assistant", "model": "up", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "hello "}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "stream"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"output_tokens": 2}}),
    ("message_stop", {"type": "message_stop"})))


def b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def iso(seconds_from_now: float) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds_from_now)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Fake:
    """One ThreadingHTTPServer on 127.0.0.1. `routes`: list of (predicate(method, path), fn(req) →
    (status, content_type, body bytes)) checked first; then the built-in endpoints."""

    def __init__(self, public_key=None, token_lifetime=3600, creds_lifetime=3600):
        self.requests = []
        self.routes = []
        self.public_key = public_key       # to verify the OAuth JWT assertion
        self.token_lifetime = token_lifetime
        self.creds_lifetime = creds_lifetime
        self.tokens_issued = 0
        self.creds_issued = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                req = {"method": self.command, "path": self.path,
                       "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
                with fake.lock:
                    fake.requests.append(req)
                status, ctype, out = fake.answer(req)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def find(self, prefix, method="POST"):
        with self.lock:
            return [r for r in self.requests if r["path"].startswith(prefix) and r["method"] == method]

    # ------------------------------------------------------------------ answers
    def answer(self, req):
        for pred, fn in self.routes:
            if pred(req["method"], req["path"]):
                return fn(req)
        path = req["path"]
        if req["method"] == "GET" and path.startswith("/creds"):
            return self.container_credentials(req)
        if path.startswith("/latest/"):
            return self.instance_metadata(req)
        if path == "/token":
            return self.oauth_token(req)
        if path.startswith("/sts") or path == "/":
            return self.sts(req)
        if path.startswith("/openai/"):
            return 200, "application/json", json.dumps(OPENAI_REPLY).encode()
        if ":streamRawPredict" in path:
            return 200, "text/event-stream", ANTHROPIC_STREAM
        if ":streamGenerateContent" in path:
            return 200, "text/event-stream", GEMINI_STREAM
        if ":rawPredict" in path:
            return 200, "application/json", json.dumps(ANTHROPIC_REPLY).encode()
        if ":generateContent" in path:
            return 200, "application/json", json.dumps(GEMINI_REPLY).encode()
        if path.startswith("/model/") and path.endswith("/converse"):
            return 200, "application/json", json.dumps(CONVERSE_REPLY).encode()
        return 404, "application/json", b'{"error":{"message":"fake: no route"}}'

    def container_credentials(self, req):
        with self.lock:
            self.creds_issued += 1
            n = self.creds_issued
        doc = {"AccessKeyId": "ASIACONTAINER%d" % n, "SecretAccessKey": "container-secret-%d" % n,
               "Token": "container-token-%d" % n, "Expiration": iso(self.creds_lifetime)}
        return 200, "application/json", json.dumps(doc).encode()

    # IMDSv2 (what botocore's InstanceMetadataFetcher speaks): PUT /latest/api/token with a TTL
    # header gives a session token; every GET must carry it.
    IMDS_TOKEN = "imds-session-token"
    IMDS_ROLE = "busbar-node-role"

    def instance_metadata(self, req):
        path, h = req["path"], req["headers"]
        if path == "/latest/api/token":
            if req["method"] != "PUT" or "x-aws-ec2-metadata-token-ttl-seconds" not in h:
                return 400, "text/plain", b"bad token request"
            return 200, "text/plain", self.IMDS_TOKEN.encode()
        if h.get("x-aws-ec2-metadata-token") != self.IMDS_TOKEN:
            return 401, "text/plain", b"unauthorized"
        creds = "/latest/meta-data/iam/security-credentials/"
        if path == creds:
            return 200, "text/plain", self.IMDS_ROLE.encode()
        if path == creds + self.IMDS_ROLE:
            doc = {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "ASIAIMDS",
                   "SecretAccessKey": "imds-secret", "Token": "imds-token",
                   "Expiration": iso(self.creds_lifetime), "LastUpdated": iso(0)}
            return 200, "application/json", json.dumps(doc).encode()
        return 404, "text/plain", b"not found"

    def sts(self, req):
        form = dict(urllib.parse.parse_qsl(req["body"].decode()))
        action = form.get("Action")
        if action not in ("AssumeRole", "AssumeRoleWithWebIdentity"):
            return 400, "text/xml", b"<ErrorResponse><Error><Code>InvalidAction</Code></Error></ErrorResponse>"
        key = "ASIAWEBID" if action == "AssumeRoleWithWebIdentity" else "ASIAROLE"
        xml = ("<{a}Response xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><{a}Result><Credentials>"
               "<AccessKeyId>{k}</AccessKeyId><SecretAccessKey>{k}-secret</SecretAccessKey>"
               "<SessionToken>{k}-token</SessionToken><Expiration>{e}</Expiration></Credentials>"
               "</{a}Result></{a}Response>").format(a=action, k=key, e=iso(self.creds_lifetime))
        return 200, "text/xml", xml.encode()

    def oauth_token(self, req):
        form = dict(urllib.parse.parse_qsl(req["body"].decode()))
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, "application/json", b'{"error":"unsupported_grant_type"}'
        head, claims, sig = form["assertion"].split(".")
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        try:
            self.public_key.verify(b64url_decode(sig), (head + "." + claims).encode(),
                                   padding.PKCS1v15(), hashes.SHA256())
        except Exception:
            return 400, "application/json", b'{"error":"invalid_grant","error_description":"bad signature"}'
        c = json.loads(b64url_decode(claims))
        if (json.loads(b64url_decode(head)).get("alg") != "RS256"
                or c.get("scope") != "https://www.googleapis.com/auth/cloud-platform"
                or c.get("aud") != self.url + "/token" or c["exp"] - c["iat"] != 3600):
            return 400, "application/json", b'{"error":"invalid_grant"}'
        with self.lock:
            self.tokens_issued += 1
            n = self.tokens_issued
        doc = {"access_token": "ya29.fake-%d" % n, "expires_in": self.token_lifetime, "token_type": "Bearer"}
        return 200, "application/json", json.dumps(doc).encode()


def service_account(path, token_uri="https://oauth2.googleapis.com/token"):
    """Writes a fresh service-account key file; returns the private key object."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "proj-test", "private_key_id": "kid1",
        "private_key": pem, "client_email": "busbar@proj-test.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri}))
    return key
