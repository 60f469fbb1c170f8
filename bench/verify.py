"""What checking a virtual key costs a worker, in-process (no server): the signed token in the Rust
gateway's format (busbar/governance/model.py, an ed25519 signature over the claims).

- `verify-uncached`: `Signer.verify` of a token, the whole check a worker does on the first sight
  of a token (base64, claims JSON, OpenSSL's ed25519 verify through cbusbar/ed25519.pyx, expiry);
- `ed25519-openssl`, `ed25519-cryptography`: the signature check alone, through libcrypto
  (cbusbar/ed25519.pyx, what busbar uses) and through the `cryptography` package (its fallback);
- `mint`: the admin API's signing of one token;
- `verify-cached`: what every later request with that token pays, the worker's cache lookup in C
  (cbusbar.ledger.Credentials.accept: the header's value, the key record, its generation, state and
  expiry).

Usage:
  python bench/verify.py              µs per call, min (and median) of 7 timeit repeats
  python bench/verify.py mint         only the cases whose names contain an argument
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from busbar.governance.model import KeyRecord, Signer, new_generation, new_key_id  # noqa: E402
from cbusbar import ed25519  # noqa: E402
from cbusbar.ledger import Credentials  # noqa: E402


def cases():
    signer = Signer(os.urandom(32))
    sub, gen = new_key_id(), new_generation()
    exp = int(time.time()) + 86400
    token = signer.mint(sub, exp, gen)
    now = time.time()
    body, sig_b64 = token[4:].split(".")
    import base64
    payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    sig = base64.urlsafe_b64decode(sig_b64 + "=" * (-len(sig_b64) % 4))
    out = {
        "verify-uncached": lambda: signer.verify(token, now),
        "mint": lambda: signer.mint(sub, exp, gen),
    }
    if ed25519.AVAILABLE:
        key = ed25519.Ed25519Key(signer.seed)
        out["ed25519-openssl"] = lambda: key.verify(sig, payload)
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        pub = Ed25519PrivateKey.from_private_bytes(signer.seed).public_key()
        out["ed25519-cryptography"] = lambda: pub.verify(sig, payload)
    except ImportError:
        pass
    creds = Credentials()
    headers = {b"authorization": b"Bearer " + token.encode()}
    rec = KeyRecord(sub, "bench", gen=gen)
    keys = {sub: rec}
    creds.remember(headers, (sub, exp, gen, signer), 16)
    assert creds.accept(headers, signer, keys, now) is rec
    out["verify-cached"] = lambda: creds.accept(headers, signer, keys, now)
    return out


def main(argv):
    wanted = [a for a in argv if not a.startswith("-")]
    print("ed25519 through %s" % ("OpenSSL libcrypto (cbusbar/ed25519.pyx)" if ed25519.AVAILABLE
                                  else "the cryptography package (%s)" % ed25519.WHY))
    for name, fn in cases().items():
        if wanted and not any(w in name for w in wanted):
            continue
        number = 2000 if "cached" in name and "un" not in name else 200
        runs = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=7)]
        print("%-22s %9.2f µs  (median %.2f)" % (name, min(runs), statistics.median(runs)))


if __name__ == "__main__":
    main(sys.argv[1:])
