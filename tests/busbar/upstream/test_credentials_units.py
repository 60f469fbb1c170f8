"""The credential sources and the refresher, without a server: the JWT assertion as Google
verifies it, refresh timing, the refresher's retry and swap."""
import asyncio
import json
import time

import pytest

from busbar.upstream import refresh
from busbar.upstream.gcp_oauth import (
    GcpTokenSource, ServiceAccountError, TokenError, assertion, parse_service_account)
from tests.integration.fakes import Fake, b64url_decode, service_account


@pytest.fixture(params=["openssl", "cryptography"])
def signer_backend(request, monkeypatch):
    """Each test below runs with both RS256 signers: OpenSSL's through cbusbar/rs256.pyx (what the
    executable has) and the `cryptography` fallback (an interpreter without a usable libcrypto)."""
    from cbusbar import rs256
    assert rs256.AVAILABLE, rs256.WHY
    if request.param == "cryptography":
        monkeypatch.setattr(rs256, "AVAILABLE", False)
    return request.param


def test_assertion_is_rs256_with_the_grant_claims(tmp_path, signer_backend):
    key = service_account(tmp_path / "sa.json")
    info = parse_service_account((tmp_path / "sa.json").read_text())
    jwt = assertion(info, "https://oauth2.googleapis.com/token", now=1700000000).decode()
    head, claims, sig = jwt.split(".")
    assert json.loads(b64url_decode(head)) == {"alg": "RS256", "typ": "JWT", "kid": "kid1"}
    assert json.loads(b64url_decode(claims)) == {
        "iss": "busbar@proj-test.iam.gserviceaccount.com",
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "aud": "https://oauth2.googleapis.com/token", "iat": 1700000000, "exp": 1700003600}
    # google-auth's own verifier (the library Google's SDKs use) accepts a fresh one.
    from google.auth import jwt as gjwt
    from cryptography.hazmat.primitives import serialization
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    fresh = assertion(info, "https://oauth2.googleapis.com/token")
    claims = gjwt.decode(fresh, certs=[pem], audience="https://oauth2.googleapis.com/token")
    assert claims["iss"] == "busbar@proj-test.iam.gserviceaccount.com"


def test_parse_refuses_what_is_not_a_service_account(signer_backend):
    with pytest.raises(ServiceAccountError, match="not JSON"):
        parse_service_account("{")
    with pytest.raises(ServiceAccountError, match="no private_key"):
        parse_service_account(json.dumps({"type": "service_account", "client_email": "a", "token_uri": "t"}))
    with pytest.raises(ServiceAccountError, match="not a PEM private key"):
        parse_service_account(json.dumps({"type": "service_account", "client_email": "a",
                                          "token_uri": "t", "private_key": "nope"}))


def test_token_fetch_against_a_fake_endpoint(tmp_path, signer_backend):
    key = service_account(tmp_path / "sa.json")
    fake = Fake(public_key=key.public_key(), token_lifetime=120)
    try:
        src = GcpTokenSource((tmp_path / "sa.json").read_text(), fake.url + "/token")
        token, exp = src.fetch()
        assert token == "ya29.fake-1" and 110 < exp - time.time() <= 120
        bad = GcpTokenSource((tmp_path / "sa.json").read_text(), fake.url + "/other")
        with pytest.raises(TokenError, match="answered 404") as e:
            bad.fetch()
        assert "PRIVATE" not in str(e.value)
    finally:
        fake.close()


def test_parse_refuses_keys_that_cannot_sign_rs256(signer_backend):
    """An EC key is not RS256's; an encrypted key is refused without a passphrase prompt."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    locked = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"))
    doc = {"type": "service_account", "client_email": "a", "token_uri": "t"}
    with pytest.raises(ServiceAccountError, match="not an RSA key"):
        parse_service_account(json.dumps({**doc, "private_key": ec_pem.decode()}))
    with pytest.raises(ServiceAccountError, match="not a PEM private key"):
        parse_service_account(json.dumps({**doc, "private_key": locked.decode()}))


@pytest.mark.parametrize("fmt", ["PKCS8", "TraditionalOpenSSL"])
@pytest.mark.parametrize("bits", [2048, 4096])
def test_openssl_rs256_is_cryptographys_signature(fmt, bits):
    """RSASSA-PKCS1-v1_5 is deterministic: cbusbar/rs256.pyx's signature is byte for byte the
    one `cryptography` makes with the same key, for PKCS#8 and PKCS#1 PEM, and verifies."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    from cbusbar import rs256
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    pem = key.private_bytes(serialization.Encoding.PEM, getattr(serialization.PrivateFormat, fmt),
                            serialization.NoEncryption())
    signer = rs256.RsaKey(pem)
    assert signer.size == bits // 8 and "PRIVATE" not in repr(signer)
    for message in (b"", b"header.claims", bytes(range(256)) * 100):
        sig = signer.sign(message)
        assert sig == key.sign(message, padding.PKCS1v15(), hashes.SHA256())
        key.public_key().verify(sig, message, padding.PKCS1v15(), hashes.SHA256())
    with pytest.raises(ValueError):
        rs256.RsaKey(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    # a failed parse leaves nothing on OpenSSL's error queue for the ssl module to misreport
    import ssl
    ssl.create_default_context()


def test_next_delay():
    now = 1000.0
    assert refresh.next_delay(None, 300, now) is None
    assert refresh.next_delay(now + 3600, 300, now) == 3300       # margin before expiry
    assert refresh.next_delay(now + 400, 300, now) == 200         # short-lived: half-life
    assert refresh.next_delay(now + 1, 300, now) == refresh.MIN_DELAY


class FlakySource:
    refresh_margin = 1.5

    def __init__(self):
        self.calls = 0

    def fetch(self):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("first try fails")
        return "v%d" % self.calls, time.time() + 2.0


def test_refresher_retries_then_swaps(monkeypatch):
    monkeypatch.setattr(refresh, "RETRY_FIRST", 0.05)
    monkeypatch.setattr(refresh, "MIN_DELAY", 0.05)
    applied = []

    async def run():
        r = refresh.Refresher(asyncio.get_running_loop())
        src = FlakySource()
        r.add(src, applied.append)
        await r.start(timeout=2)
        assert applied == []                 # the first fetch failed; no value yet
        await asyncio.sleep(0.3)
        assert applied == ["v2"]             # retried shortly after
        await asyncio.sleep(1.5)             # half of the 2 s lifetime: renewed
        r.close()
        return src.calls

    calls = asyncio.run(run())
    assert applied[:2] == ["v2", "v3"] and calls >= 3
