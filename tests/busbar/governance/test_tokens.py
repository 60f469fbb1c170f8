"""Virtual-key tokens in the Rust gateway's format (GetBusbar/busbar governance/signing.rs):
`bbk_` + base64url-no-pad(claims JSON) + `.` + base64url-no-pad(ed25519 signature over those
bytes). A token minted here verifies under an independent implementation of that format (the
`cryptography` package and hand-written JSON) and the reverse; the Rust module's own test cases
hold; the signing key is read as the Rust side reads it."""
from __future__ import annotations

import base64
import json
import os
import pickle
import random

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from busbar.config.checks import Problems
from busbar.governance.model import (
    KID, Signer, generation_marker, marker_generation, new_aws_access_key_id, new_generation,
    new_key_id, parse_signing_secret)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def rust_claims(sub: str, exp: int, gen: str | None, kid: str = "k1") -> bytes:
    """The claims as serde_json writes the Rust TokenClaims struct: fields in declaration order,
    compact, `g` skipped when None."""
    text = '{"sub":%s,"exp":%d,"kid":%s' % (json.dumps(sub), exp, json.dumps(kid))
    if gen is not None:
        text += ',"g":%s' % json.dumps(gen)
    return (text + "}").encode()


def independent_mint(seed: bytes, sub: str, exp: int, gen: str | None, kid: str = "k1") -> str:
    payload = rust_claims(sub, exp, gen, kid)
    sig = Ed25519PrivateKey.from_private_bytes(seed).sign(payload)
    return "bbk_" + b64(payload) + "." + b64(sig)


def independent_verify(seed: bytes, token: str) -> dict:
    assert token.startswith("bbk_")
    payload_b64, sig_b64 = token[4:].split(".")
    payload, sig = unb64(payload_b64), unb64(sig_b64)
    Ed25519PrivateKey.from_private_bytes(seed).public_key().verify(sig, payload)
    return json.loads(payload), payload


SEED = bytes(range(32))


def test_a_token_minted_by_the_documented_algorithm_verifies_here():
    signer = Signer(SEED)
    for gen in (new_generation(), None):
        sub = new_key_id()
        tok = independent_mint(SEED, sub, 4_000_000_000, gen)
        assert signer.verify(tok, 1_000) == (sub, 4_000_000_000, gen)
    # the same token under another key, or once expired: refused
    tok = independent_mint(SEED, "vk_x", 2_000, "g1")
    assert Signer(bytes(32)).verify(tok, 1_000) is None
    assert signer.verify(tok, 2_000) is None and signer.verify(tok, 1_999) == ("vk_x", 2_000, "g1")
    # another kid (a rotated-away signing key) is refused even with a good signature
    assert signer.verify(independent_mint(SEED, "vk_x", 2_000, None, kid="k2"), 1_000) is None


def test_a_token_minted_here_is_the_documented_bytes():
    signer = Signer(SEED)
    gen = new_generation()
    tok = signer.mint("vk_" + "a" * 32, 1_900_000_000, gen)
    claims, payload = independent_verify(SEED, tok)
    assert payload == rust_claims("vk_" + "a" * 32, 1_900_000_000, gen)
    assert claims == {"sub": "vk_" + "a" * 32, "exp": 1_900_000_000, "kid": KID, "g": gen}
    # ed25519 is deterministic: both implementations produce the very same token
    assert tok == independent_mint(SEED, "vk_" + "a" * 32, 1_900_000_000, gen)
    assert signer.mint("vk_b", 7, None) == independent_mint(SEED, "vk_b", 7, None)
    assert "=" not in tok and "+" not in tok and "/" not in tok


# The Rust module's own tests (signing.rs `mod tests`), one by one.
def test_rust_mint_then_verify_roundtrips():
    s = Signer(bytes([7]) * 32)
    tok = s.mint("vk_abc", 2000, None)
    assert tok.startswith("bbk_")
    assert s.verify(tok, 1000) == ("vk_abc", 2000, None)


def test_rust_expired_token_rejected():
    s = Signer(bytes([7]) * 32)
    tok = s.mint("vk_abc", 1000, None)
    assert s.verify(tok, 1000) is None and s.verify(tok, 1001) is None
    assert s.verify(tok, 999) is not None


def test_rust_tampered_token_rejected():
    s = Signer(bytes([7]) * 32)
    tok = s.mint("vk_abc", 2000, None)
    payload, sig = tok[4:].split(".")
    last = payload[-1]
    tampered = "bbk_" + payload[:-1] + ("B" if last == "A" else "A") + "." + sig
    assert s.verify(tampered, 1000) is None
    # every single-character change anywhere is refused
    rng = random.Random(5)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(4, len(tok)):
        c = rng.choice([x for x in alphabet if x != tok[i]])
        assert s.verify(tok[:i] + c + tok[i + 1:], 1000) is None, i


def test_rust_token_fails_after_rotation():
    tok = Signer(bytes([1]) * 32).mint("vk_abc", 2000, None)
    assert Signer(bytes([2]) * 32).verify(tok, 1000) is None               # same kid, other key
    assert Signer(bytes([3]) * 32, kid="k2").verify(tok, 1000) is None     # another kid


def test_rust_malformed_tokens_rejected():
    s = Signer(bytes([7]) * 32)
    for bad in ("not-a-token", "bbk_onlyonesegment", "bbk_%%%.%%%", "bbk_YWJj.YWJj", "", "bbk_.",
                "bbk_" + "A" * 2000 + ".x"):
        assert s.verify(bad, 1000) is None, bad


def test_a_generated_key_persists_and_reloads():
    seed = os.urandom(32)
    tok = Signer(seed).mint("vk_x", 2000, None)
    assert Signer(bytes.fromhex(seed.hex())).verify(tok, 1000) is not None
    again = pickle.loads(pickle.dumps(Signer(seed)))       # how the config reaches the workers
    assert again == Signer(seed) and again.verify(tok, 1000) == ("vk_x", 2000, None)


def test_the_signer_never_prints_its_key():
    seed = bytes([7]) * 32
    s = Signer(seed)
    for text in (repr(s), str(s)):
        assert "redacted" in text and seed.hex() not in text and "07" * 4 not in text


def test_strict_base64_and_claims():
    """Padding, the standard alphabet, non-canonical trailing bits and claims of the wrong type are
    refused, as the Rust decoder refuses them (URL_SAFE_NO_PAD, serde)."""
    s = Signer(SEED)
    good = s.mint("vk_abc", 4_000_000_000, "gen")
    payload_b64, sig_b64 = good[4:].split(".")
    assert s.verify("bbk_%s=.%s" % (payload_b64, sig_b64), 0) is None     # padded
    assert len(sig_b64) == 86                                                # 64 bytes, 4 spare bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spare = alphabet[alphabet.index(sig_b64[-1]) ^ 1]                       # one spare bit set
    assert unb64(sig_b64[:-1] + spare) == unb64(sig_b64)                     # same bytes...
    assert s.verify("bbk_%s.%s" % (payload_b64, sig_b64[:-1] + spare), 0) is None   # ...refused
    std = base64.b64encode(unb64(sig_b64)).rstrip(b"=").decode()
    if std != sig_b64:
        assert s.verify("bbk_%s.%s" % (payload_b64, std), 0) is None         # standard alphabet
    seed = SEED
    for claims in ({"sub": 1, "exp": 5, "kid": "k1"}, {"sub": "a", "exp": "5", "kid": "k1"},
                   {"sub": "a", "exp": 5.0, "kid": "k1"}, {"sub": "a", "exp": -1, "kid": "k1"},
                   {"sub": "a", "exp": 2 ** 64, "kid": "k1"}, {"sub": "a", "exp": True, "kid": "k1"},
                   {"sub": "a", "exp": 5, "kid": "k1", "g": 3}, {"exp": 5, "kid": "k1"}, [1, 2]):
        payload = json.dumps(claims, separators=(",", ":")).encode()
        sig = Ed25519PrivateKey.from_private_bytes(seed).sign(payload)
        assert s.verify("bbk_" + b64(payload) + "." + b64(sig), 0) is None, claims
    # unknown fields are ignored (serde's default) and `g: null` is no generation
    payload = b'{"sub":"vk_a","exp":9,"kid":"k1","g":null,"x":[1]}'
    sig = Ed25519PrivateKey.from_private_bytes(seed).sign(payload)
    assert s.verify("bbk_" + b64(payload) + "." + b64(sig), 0) == ("vk_a", 9, None)


def test_the_signing_key_is_read_as_the_rust_side_reads_it():
    seed = os.urandom(32)
    assert parse_signing_secret(seed) == seed                                # 32 raw bytes
    assert parse_signing_secret(seed.hex().encode()) == seed                 # 64 hex
    assert parse_signing_secret((" %s\n" % seed.hex().upper()).encode()) == seed
    for bad in (b"s" * 40, b"x" * 64, seed.hex()[:62].encode(), b"", seed + b"\n\n",
                ("ab " * 21 + "a").encode(), b"\xff" * 64):
        assert parse_signing_secret(bad) is None, bad


def _parse_auth(tmp_path, ref, env):
    from busbar.governance.config import parse
    out = Problems()
    g = parse({"auth": {"chain": ["keys"], "signing_key": ref}}, {"chain": ["keys"],
              "signing_key": ref}, {}, {}, env, str(tmp_path), out)
    return g, out


def test_auth_signing_key_from_a_file_or_the_environment(tmp_path):
    seed = os.urandom(32)
    (tmp_path / "raw.key").write_bytes(seed)
    (tmp_path / "hex.key").write_text(seed.hex() + "\n")
    for ref, env in (({"file": "raw.key"}, {}), ({"file": "hex.key"}, {}),
                     ({"env": "K"}, {"K": seed.hex()})):
        g, out = _parse_auth(tmp_path, ref, env)
        assert not out.errors, out.errors
        assert g.signing_key == Signer(seed)
    # an HMAC secret of an earlier busbar: refused, naming the way to a good one, never quoting it
    g, out = _parse_auth(tmp_path, {"env": "K"}, {"K": "hmac-secret-" + "s" * 30})
    [err] = [e for e in out.errors]
    assert err.startswith("auth.signing_key: must be an ed25519 signing key")
    assert "busbar --generate-signing-key" in err and "hmac-secret" not in err


def test_the_stored_generation_marker():
    gen = new_generation()
    assert generation_marker("vk_a", gen) == "binding:vk_a:" + gen
    assert marker_generation(generation_marker("vk_a", gen)) == gen
    assert marker_generation("binding:vk_a") is None          # a key from before generations
    assert marker_generation("principal:alice") is None
    assert len(gen) == 32 and int(gen, 16) >= 0
    akid = new_aws_access_key_id()
    assert len(akid) == 20 and akid.startswith("AKIA") and akid[4:].isalnum() and akid.isupper()
    assert new_key_id().startswith("vk_") and len(new_key_id()) == 35


def test_openssl_ed25519_agrees_with_cryptography():
    """cbusbar/ed25519.pyx (OpenSSL's libcrypto) against the `cryptography` package as the oracle:
    the same public key, byte-identical signatures, and the same verdicts on good and bad ones."""
    from cbusbar import ed25519
    if not ed25519.AVAILABLE:
        pytest.skip(ed25519.WHY)
    rng = random.Random(11)
    for _ in range(200):
        seed = bytes(rng.randrange(256) for _ in range(32))
        msg = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        mine = ed25519.Ed25519Key(seed)
        oracle = Ed25519PrivateKey.from_private_bytes(seed)
        pub = oracle.public_key().public_bytes(serialization.Encoding.Raw,
                                               serialization.PublicFormat.Raw)
        assert mine.public_bytes == pub
        sig = mine.sign(msg)
        assert sig == oracle.sign(msg)
        assert mine.verify(sig, msg) and ed25519.verify_public(pub, sig, msg)
        bad = bytearray(sig)
        bad[rng.randrange(64)] ^= 1 << rng.randrange(8)
        with pytest.raises(InvalidSignature):
            oracle.public_key().verify(bytes(bad), msg)
        assert not mine.verify(bytes(bad), msg)
        assert not mine.verify(sig, msg + b"x") and not mine.verify(sig[:63], msg)
    with pytest.raises(ValueError):
        ed25519.Ed25519Key(b"short")
