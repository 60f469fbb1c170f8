"""Google service-account access tokens for Vertex AI: the OAuth2 JWT bearer grant (RFC 7523);
and the client-credentials grant (RFC 6749 §4.4) of `auth: oauth-client-credentials`.

busbar signs an RS256 assertion {iss: client_email, scope: cloud-platform, aud: token URL, iat,
exp} with the service account's private key and trades it at the token URL for an access token
(`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`), exactly what google-auth's
`service_account.Credentials.refresh` does (google/oauth2/_client.py). The signature (RSA PKCS#1
v1.5 over SHA-256) is OpenSSL's, through the libcrypto the interpreter loads for ssl and hashlib
(cbusbar/rs256.pyx): the single-file executable carries no `cryptography` (its own second OpenSSL
would add 3 MB). Where that finds no libcrypto, `cryptography` signs, as google-auth does.

`fetch()` blocks (one HTTPS POST): busbar.upstream.refresh runs it on a worker thread, ahead of
expiry, so no request ever waits for a token. Messages never include the key or the token.
"""
from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

# The scope Vertex AI documents for service accounts (and what google-genai asks for).
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# Google issues assertions valid for at most an hour; google-auth asks for exactly 3600 s.
ASSERTION_LIFETIME = 3600
# Google's token endpoint answers in well under a second; a stuck one must not hold the refresh
# thread for long (it retries with backoff).
TOKEN_TIMEOUT = 10.0
# google-auth refreshes 3 min 45 s before expiry (_helpers.REFRESH_THRESHOLD); we refresh 5 min
# early, off the request path, so a token is never used in its last minutes.
REFRESH_MARGIN = 300.0
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class ServiceAccountError(ValueError):
    """The credentials file is not a usable service account (message safe to print)."""


class TokenError(RuntimeError):
    """The token endpoint refused or failed (message safe to log: no key, no token)."""


@dataclass(frozen=True, slots=True)
class ServiceAccountInfo:
    client_email: str
    token_uri: str
    private_key_id: str | None
    key: object          # has sign(message) -> RS256 signature bytes (signer())

    def __repr__(self) -> str:
        return f"ServiceAccountInfo({self.client_email!r}, token_uri={self.token_uri!r})"


def parse_service_account(text: str) -> ServiceAccountInfo:
    """A service-account JSON key file (as `gcloud iam service-accounts keys create` writes it)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ServiceAccountError("the credentials file is not JSON") from None
    if not isinstance(doc, dict):
        raise ServiceAccountError("the credentials file is not a JSON object")
    if doc.get("type") != "service_account":
        raise ServiceAccountError("expected a service-account key file (\"type\": \"service_account\")")
    for field in ("client_email", "private_key", "token_uri"):
        if not isinstance(doc.get(field), str) or not doc[field]:
            raise ServiceAccountError(f"the credentials file has no {field}")
    key = signer(doc["private_key"])
    kid = doc.get("private_key_id")
    return ServiceAccountInfo(doc["client_email"], doc["token_uri"],
                              kid if isinstance(kid, str) else None, key)


def signer(pem: str):
    """The RS256 signer of a PEM private key (PKCS#8 or PKCS#1, unencrypted): OpenSSL's through
    cbusbar/rs256.pyx, else `cryptography`'s. ServiceAccountError when it is not one."""
    from cbusbar import rs256
    if rs256.AVAILABLE:
        try:
            return rs256.RsaKey(pem.encode())
        except ValueError:
            raise ServiceAccountError(NOT_PEM) from None
        except TypeError:
            raise ServiceAccountError(NOT_RSA) from None
    return _CryptographySigner(pem)


NOT_PEM = "the credentials file's private_key is not a PEM private key"
NOT_RSA = "the credentials file's private_key is not an RSA key (RS256)"


class _CryptographySigner:
    """RS256 through the `cryptography` package (an install whose interpreter has no libcrypto
    that cbusbar/rs256.pyx can use)."""
    __slots__ = ("_key",)

    def __init__(self, pem: str):
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.hazmat.primitives.serialization import load_pem_private_key
        try:
            key = load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError):
            raise ServiceAccountError(NOT_PEM) from None
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ServiceAccountError(NOT_RSA)
        self._key = key

    def __repr__(self) -> str:
        return "_CryptographySigner()"

    def sign(self, message: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        return self._key.sign(message, padding.PKCS1v15(), hashes.SHA256())


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def assertion(info: ServiceAccountInfo, audience: str, now: float | None = None,
              scope: str = CLOUD_PLATFORM, subject: str | None = None) -> bytes:
    """The signed JWT (compact form) for the bearer grant. `subject`: the `sub` claim (RFC 7523
    §3), only when set: for Google it asks for domain-wide delegation (impersonation)."""
    iat = int(time.time() if now is None else now)
    header = {"alg": "RS256", "typ": "JWT"}
    if info.private_key_id:
        header["kid"] = info.private_key_id
    claims = {"iss": info.client_email, "scope": scope, "aud": audience, "iat": iat,
              "exp": iat + ASSERTION_LIFETIME}
    if subject is not None:
        claims["sub"] = subject
    signing_input = (_b64(json.dumps(header, separators=(",", ":")).encode()) + b"." +
                     _b64(json.dumps(claims, separators=(",", ":")).encode()))
    signature = info.key.sign(signing_input)
    return signing_input + b"." + _b64(signature)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # The token URL passed the SSRF guard; a redirect would go somewhere that did not.
    def redirect_request(self, *args, **kwargs):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class GcpTokenSource:
    """One service account's access tokens. `fetch()` → (token, expires_at epoch seconds)."""

    kind = "gcp-oauth"
    refresh_margin = REFRESH_MARGIN

    def __init__(self, service_account_json: str, token_url: str | None = None,
                 scope: str = CLOUD_PLATFORM, subject: str | None = None):
        self.info = parse_service_account(service_account_json)
        self.token_url = token_url or self.info.token_uri
        self.scope = scope
        self.subject = subject

    def __repr__(self) -> str:
        return f"GcpTokenSource({self.info.client_email!r}, token_url={self.token_url!r})"

    def fetch(self):
        now = time.time()
        return token_grant(self.token_url, {
            "grant_type": JWT_BEARER,
            "assertion": assertion(self.info, self.token_url, now, self.scope,
                                   self.subject).decode(),
        }, now)


def token_grant(token_url: str, form: dict, now: float):
    """POSTs an OAuth 2.0 token request (a form, RFC 6749 §4) and reads its answer: (access
    token, expires_at). `expires_in` absent is an hour (RFC 6749 §5.1 only recommends it); a
    string or a fraction of seconds is read as a number (some identity providers send "3600").
    Messages name the endpoint and the status, never the form or the token."""
    body = urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(token_url, data=body, method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"})
    try:
        with _OPENER.open(req, timeout=TOKEN_TIMEOUT) as resp:
            raw = resp.read(65536)
    except urllib.error.HTTPError as exc:
        raise TokenError(f"token endpoint {token_url} answered {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise TokenError(f"token endpoint {token_url} failed: {exc.__class__.__name__}") from None
    try:
        doc = json.loads(raw)
        token = doc["access_token"]
        expires_in = float(doc.get("expires_in", 3600))
    except (ValueError, KeyError, TypeError):
        raise TokenError(f"token endpoint {token_url} sent no access_token") from None
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
        raise TokenError(f"token endpoint {token_url} sent an unusable access_token")
    if not expires_in >= 0:
        raise TokenError(f"token endpoint {token_url} sent an unusable expires_in")
    return token, now + expires_in


class ClientCredentialsSource:
    """`auth: oauth-client-credentials` (RFC 6749 §4.4, e.g. Azure OpenAI through Entra ID): the
    provider's `api_key`, CLIENT_ID:CLIENT_SECRET, traded at its `token_url` for a bearer of its
    `scope`, as the Rust gateway sends them (client_id and client_secret in the form, §2.3.1).
    `fetch()` → (token, expires_at)."""

    kind = "oauth-client-credentials"
    refresh_margin = REFRESH_MARGIN

    def __init__(self, credential: str, token_url: str, scope: str):
        client_id, _, secret = credential.partition(":")
        self.client_id = client_id
        self._secret = secret
        self.token_url = token_url
        self.scope = scope

    def __repr__(self) -> str:
        # never the secret
        return f"ClientCredentialsSource({self.client_id!r}, token_url={self.token_url!r})"

    def fetch(self):
        now = time.time()
        return token_grant(self.token_url, {
            "grant_type": "client_credentials", "client_id": self.client_id,
            "client_secret": self._secret, "scope": self.scope}, now)
