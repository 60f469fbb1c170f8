"""Egress request heads, built once per provider at startup so that a request only adds its path,
its length and (for Bedrock) its signature.

Egress carries only gateway-built headers (SPEC §1.2): auth, Content-Type, a User-Agent copied from
the vendor's own SDK (anti-fingerprinting), Accept. Client vendor beta headers (`anthropic-beta`,
`openai-beta`) are added per request on same-protocol routes only.
"""
from __future__ import annotations

USER_AGENTS = {
    "anthropic": b"Anthropic/Python 0.39.0",
    "openai": b"OpenAI/Python 1.54.0",
    "responses": b"OpenAI/Python 1.54.0",
    "gemini": b"google-genai-sdk/0.8.0 gl-python/3.11",
    "bedrock": b"Boto3/1.35.0 md/Botocore#1.35.0",
    "cohere": b"cohere-python/5.11.0",
}

# Same-protocol only: the beta header each protocol's SDKs use to opt into preview features.
BETA_HEADERS = {"anthropic": (b"anthropic-beta",), "openai": (b"openai-beta",),
                "responses": (b"openai-beta",)}


def _clean(value: str) -> bytes:
    b = value.encode("utf-8")
    if b"\r" in b or b"\n" in b:
        raise ValueError("header values may not contain line breaks")
    return b


class Egress:
    """Everything needed to send one request to one provider."""

    __slots__ = ("provider", "protocol", "key", "host_header", "prefix", "head_json", "head_stream",
                 "signer", "host", "_lines")

    def __init__(self, provider):
        self.provider = provider
        self.protocol = provider.protocol
        self.key = (provider.scheme, provider.host, provider.port)
        default_port = 443 if provider.scheme == "https" else 80
        host = provider.host if ":" not in provider.host else "[%s]" % provider.host
        self.host = host if provider.port == default_port else "%s:%d" % (host, provider.port)
        self.prefix = provider.path_prefix
        self.signer = None
        self._lines = {}    # (path, stream) → request line + head, for unsigned requests
        lines = [b"Host: " + self.host.encode("ascii"),
                 b"User-Agent: " + USER_AGENTS.get(provider.protocol, b"okhttp/4.12.0"),
                 b"Content-Type: application/json"]
        key = provider.api_key
        auth = provider.auth
        if key:
            if auth == "bearer":
                lines.append(b"Authorization: Bearer " + _clean(key))
            elif auth == "x-api-key":
                # Anthropic OAuth tokens (sk-ant-oat…) go as a bearer, API keys as x-api-key.
                if key.startswith("sk-ant-oat"):
                    lines.append(b"Authorization: Bearer " + _clean(key))
                else:
                    lines.append(b"x-api-key: " + _clean(key))
            elif auth == "x-goog-api-key":
                lines.append(b"x-goog-api-key: " + _clean(key))
            elif auth == "api-key":
                lines.append(b"api-key: " + _clean(key))
            elif auth == "sigv4":
                from busbar.upstream.sigv4 import SigV4Signer, parse_credential
                access, secret, token = parse_credential(key)
                self.signer = SigV4Signer(access, secret, token, provider.region or "us-east-1")
        if provider.protocol == "anthropic":
            lines.append(b"anthropic-version: 2023-06-01")
        for name, value in provider.headers:
            lines.append(_clean(name) + b": " + _clean(value))
        base = b"\r\n".join(lines) + b"\r\n"
        accept_stream = (b"application/vnd.amazon.eventstream" if provider.protocol == "bedrock"
                         else b"text/event-stream")
        self.head_json = base + b"Accept: application/json\r\n"
        self.head_stream = base + b"Accept: " + accept_stream + b"\r\n"

    def request(self, path: str, body: bytes, stream: bool, extra: bytes = b"") -> bytes:
        """The whole HTTP/1.1 request: request line, headers, body."""
        if self.signer is None:
            # Paths come from the configured upstream models, so this cache is bounded.
            k = (path, stream)
            head = self._lines.get(k)
            if head is None:
                head = self._lines[k] = b"".join((
                    b"POST ", (self.prefix + path).encode("ascii"), b" HTTP/1.1\r\n",
                    self.head_stream if stream else self.head_json))
            return b"".join((head, extra, b"Content-Length: %d\r\n\r\n" % len(body), body))
        full = self.prefix + path
        head = self.head_stream if stream else self.head_json
        p, _, q = full.partition("?")
        for name, value in self.signer.sign("POST", self.host, p, q, body):
            extra += b"%s: %s\r\n" % (name.encode("ascii"), value.encode("ascii"))
        return b"".join((b"POST ", full.encode("ascii"), b" HTTP/1.1\r\n", head, extra,
                         b"Content-Length: %d\r\n\r\n" % len(body), body))
