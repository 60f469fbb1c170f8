# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Egress request heads, built once per provider at startup so that a request only adds its path,
its length and (for Bedrock) its signature.

Where a provider's credentials change over time (AWS temporary credentials, GCP OAuth tokens:
busbar/upstream/refresh.py), the refresher calls `apply()`, which swaps the signer or rebuilds the
heads once; requests stay synchronous. `ready` is False until the first credentials arrived.

The provider's own URL scheme is applied here, to the codec's path (`provider_path`, cached per
path): Azure OpenAI's /openai/deployments/{d}/…?api-version= or /openai/v1/…, Vertex AI's
/v1/projects/{p}/locations/{l}/publishers/{google|anthropic}/models/{m}:… .

Egress carries only gateway-built headers (SPEC §1.2): auth, Content-Type, a User-Agent copied from
the vendor's own SDK (anti-fingerprinting), the header lines the vendor's API requires, Accept.
Client vendor beta headers (`anthropic-beta`, `openai-beta`) are added per request on
same-protocol routes only. What each protocol sends, and its Azure and Vertex forms, is its
codec's to say (docs/codecs.md "Egress"); nothing here branches on a protocol's name.
"""
from __future__ import annotations

from urllib.parse import quote

from cbusbar.proto import PROTOCOLS, VARIANTS, codec

# Same-protocol only: the beta headers each protocol's SDKs use to opt into preview features.
BETA_HEADERS = {name: codec(name).BETA_HEADERS for name in PROTOCOLS + tuple(VARIANTS)}


def _clean(value: str) -> bytes:
    b = value.encode("utf-8")
    if b"\r" in b or b"\n" in b:
        raise ValueError("header values may not contain line breaks")
    return b


class Egress:
    """Everything needed to send one request to one provider."""

    def __init__(self, provider):
        c = codec(provider.protocol)
        self.provider = provider
        self.protocol = provider.protocol
        self.key = (provider.scheme, provider.host, provider.port)
        default_port = 443 if provider.scheme == "https" else 80
        host = provider.host if ":" not in provider.host else "[%s]" % provider.host
        self.host = host if provider.port == default_port else "%s:%d" % (host, provider.port)
        self.prefix = provider.path_prefix
        self.signer = None
        self.source = None      # a credential source the gateway's Refresher keeps fresh
        self.ready = True
        self._lines = {}    # (path, stream) → request line + head, for unsigned requests
        self._paths = {}    # codec path → provider path (signed requests)
        # Vertex AI: the codec's publisher there; vertex_body, where the model moves from the
        # body into the path (Claude), else the codec's path is rewritten (Gemini). A provider's
        # `path_base` (the Rust grammar's way there) is the base those paths go under, in place
        # of the one `vertex:` builds: only for the codecs with a model in the URL there.
        self.path_base = provider.path_base if c.VERTEX_PUBLISHER is not None else None
        self.vertex_publisher = c.VERTEX_PUBLISHER if (
            provider.vertex_project is not None or self.path_base is not None) else None
        self.vertex_body = c.vertex_body if self.vertex_publisher is not None else None
        # BYOK: the caller's own provider key goes upstream in this provider's carrier
        self.passthrough = provider.upstream_credentials == "passthrough"
        self.accept_stream = c.STREAM_CONTENT_TYPE
        lines = [b"Host: " + self.host.encode("ascii"),
                 b"User-Agent: " + c.USER_AGENT,
                 b"Content-Type: application/json"]
        self._auth = b""
        key = provider.api_key
        auth = provider.auth
        if auth == "oauth-client-credentials":
            from busbar.upstream.gcp_oauth import ClientCredentialsSource
            self.source = ClientCredentialsSource(key, provider.token_url, provider.oauth_scope)
            self.ready = False
        elif key:
            if auth == "bearer":
                self._auth = b"Authorization: Bearer " + _clean(key) + b"\r\n"
            elif auth == "x-api-key":
                # Anthropic OAuth tokens (sk-ant-oat…) go as a bearer, API keys as x-api-key.
                if key.startswith("sk-ant-oat"):
                    self._auth = b"Authorization: Bearer " + _clean(key) + b"\r\n"
                else:
                    self._auth = b"x-api-key: " + _clean(key) + b"\r\n"
            elif auth == "x-goog-api-key":
                self._auth = b"x-goog-api-key: " + _clean(key) + b"\r\n"
            elif auth == "api-key":
                self._auth = b"api-key: " + _clean(key) + b"\r\n"
            elif auth == "sigv4":
                from busbar.upstream.sigv4 import SigV4Signer, parse_credential
                access, secret, token = parse_credential(key)
                self.signer = SigV4Signer(access, secret, token, provider.region or "us-east-1")
        elif auth == "sigv4":
            from busbar.upstream.aws_credentials import AwsCredentialSource
            self.source = AwsCredentialSource(provider.region or "us-east-1", provider.profile,
                                              provider.role_arn)
            self.ready = False
        elif auth == "oauth2":
            from busbar.upstream.gcp_oauth import CLOUD_PLATFORM, GcpTokenSource
            self.source = GcpTokenSource(provider.gcp_service_account, provider.token_url,
                                         provider.oauth_scope or CLOUD_PLATFORM,
                                         provider.oauth_subject)
            self.ready = False
        if self.vertex_publisher is None:
            lines.extend(c.API_HEADERS)     # a Vertex form carries the API version in the body
        for name, value in provider.headers:
            lines.append(_clean(name) + b": " + _clean(value))
        self._base = b"\r\n".join(lines) + b"\r\n"
        self._build()

    def _build(self):
        base = self._base + self._auth
        self.head_json = base + b"Accept: application/json\r\n"
        self.head_stream = base + b"Accept: " + self.accept_stream + b"\r\n"
        # The same heads without busbar's credential: what a request carrying the caller's own
        # goes with (pools.upstream_credentials: passthrough).
        self.bare_json = self._base + b"Accept: application/json\r\n"
        self.bare_stream = self._base + b"Accept: " + self.accept_stream + b"\r\n"
        self._lines = {}

    def apply(self, value):
        """New credentials from the refresher: a SigV4Signer, or an OAuth access token."""
        if self.provider.auth == "sigv4":
            self.signer = value
        else:
            self._auth = b"Authorization: Bearer " + _clean(value) + b"\r\n"
            self._build()
        self.ready = True

    def provider_path(self, path: str) -> str:
        """The codec's path in this provider's URL scheme (with the base URL's prefix)."""
        p = self.provider
        if p.path is not None:
            # the catalog's (or the provider's) `path`: static, in place of the codec's
            return self.prefix + p.path
        if p.azure:
            # The codecs' OpenAI paths all start with /v1/.
            rest = path[3:] if path.startswith("/v1/") else path
            if p.azure_deployment is not None:
                path = "/openai/deployments/%s%s%sapi-version=%s" % (
                    quote(p.azure_deployment, safe=""), rest, "&" if "?" in rest else "?",
                    p.azure_api_version)
            else:
                path = "/openai/v1" + rest
                if p.azure_api_version is not None:
                    path += ("&" if "?" in rest else "?") + "api-version=" + p.azure_api_version
        elif self.vertex_publisher is not None and self.vertex_body is None:
            # /v1beta/models/{m}:{action} → Vertex's publisher model resource (or the path_base),
            # same action.
            i = path.find("/models/")
            if i >= 0:
                if self.path_base is not None:
                    path = self.path_base + path[i + 7:]
                else:
                    path = "/v1/projects/%s/locations/%s/publishers/%s%s" % (
                        p.vertex_project, p.vertex_location, self.vertex_publisher, path[i:])
        return self.prefix + path

    def _vertex_request(self, path: str, body: bytes, stream: bool):
        """A model Vertex AI serves through rawPredict (Claude): the codec takes the model out of
        the body (vertex_body), which then names it in the path."""
        reshaped = self.vertex_body(body)
        if reshaped is None:
            return self.prefix + path, body
        model, body = reshaped
        p = self.provider
        if self.path_base is not None:
            base = self.prefix + self.path_base
        else:
            base = "%s/v1/projects/%s/locations/%s/publishers/%s/models" % (
                self.prefix, p.vertex_project, p.vertex_location, self.vertex_publisher)
        path = "%s/%s:%s" % (base, quote(str(model or ""), safe="@._-"),
                             "streamRawPredict" if stream else "rawPredict")
        return path, body

    def caller_auth(self, req):
        """(auth header lines, SigV4 signer or None) of the caller's key, wherever its SDK put it,
        in this provider's carrier; (b"", None) when the caller sent none (the upstream answers
        401, relayed as the caller's own). A provider that signs (Bedrock) signs with a caller's
        ACCESS_KEY_ID:SECRET_ACCESS_KEY[:SESSION_TOKEN], as the Rust gateway does with the token
        it forwards; any other token goes as a bearer, which is how Bedrock takes its API keys."""
        from busbar.engine.request import credential
        kind, value = credential(req)
        if kind != "token" or not value or b"\r" in value or b"\n" in value:
            return b"", None
        auth = self.provider.auth
        if auth == "sigv4":
            from busbar.upstream.sigv4 import SigV4Signer, parse_credential
            try:
                access, secret, token = parse_credential(value.decode("latin-1"))
            except ValueError:
                return b"Authorization: Bearer " + value + b"\r\n", None
            return b"", SigV4Signer(access, secret, token, self.provider.region or "us-east-1")
        if auth == "x-api-key":
            return b"x-api-key: " + value + b"\r\n", None
        if auth == "x-goog-api-key":
            return b"x-goog-api-key: " + value + b"\r\n", None
        if auth == "api-key":
            return b"api-key: " + value + b"\r\n", None
        return b"Authorization: Bearer " + value + b"\r\n", None

    def forward(self, path, body, stream, extra, req):
        """`request()` with the caller's own credential in place of busbar's: a pool (or
        provider) with upstream_credentials: passthrough. Never busbar's key, not even when the
        caller sent none (the upstream's 401 is then the caller's to read)."""
        auth, signer = self.caller_auth(req)
        return self._write(path, body, stream, extra + auth, signer, False)

    def request(self, path, body, stream, extra=b""):
        """The whole HTTP/1.1 request: request line, headers, body."""
        return self._write(path, body, stream, extra, self.signer, True)

    def _write(self, path, body, stream, extra, signer, own):
        if own:
            head = self.head_stream if stream else self.head_json
        else:
            head = self.bare_stream if stream else self.bare_json
        if self.vertex_body is not None:
            full, body = self._vertex_request(path, body, stream)
            return b"".join((b"POST ", full.encode("ascii"), b" HTTP/1.1\r\n", head, extra,
                             b"Content-Length: %d\r\n\r\n" % len(body), body))
        if signer is None:
            # Paths come from the configured upstream models, so this cache is bounded.
            k = (path, stream, own)
            line = self._lines.get(k)
            if line is None:
                line = self._lines[k] = b"".join((
                    b"POST ", self.provider_path(path).encode("ascii"), b" HTTP/1.1\r\n", head))
            return b"".join((line, extra, b"Content-Length: %d\r\n\r\n" % len(body), body))
        full = self._paths.get(path)
        if full is None:
            full = self._paths[path] = self.provider_path(path)
        p, _, q = full.partition("?")
        for name, value in signer.sign("POST", self.host, p, q, body):
            extra += b"%s: %s\r\n" % (name.encode("ascii"), value.encode("ascii"))
        return b"".join((b"POST ", full.encode("ascii"), b" HTTP/1.1\r\n", head, extra,
                         b"Content-Length: %d\r\n\r\n" % len(body), body))
