"""The admin site's surface-wide rules as tables, against the Rust gateway's docs/admin-api.md:
which budget each mutation spends, the fixed one-minute windows, the scope matrix, the cursor
encoding, and the audit chain's digest. (Through the server: tests/integration/
test_admin_v1_governance.py.)"""
from __future__ import annotations

import hashlib

from busbar.admin.audit import record_hash, verify
from busbar.admin.site import (MutationLimiter, decode_cursor, encode_cursor, mutation_class,
                               required_scope)

P = "/api/v1/admin"

# docs/admin-api.md, "Mutation rate limits": the config class (10/min) row, verbatim.
CONFIG_CLASS = ["/config/apply", "/config/settings", "/config/reload", "/config/rollback",
                "/admin-auth", "/overlay/groups", "/plugins/reload", "/plugins/rollback",
                "/restart", "/identity-providers/okta", "/identity-providers/okta/settings",
                "/export/otel", "/export/otel/settings"]
CRUD_CLASS = ["/keys", "/keys/vk_1", "/keys/vk_1/rotate", "/groups", "/groups/g", "/hooks",
              "/hooks/h/settings", "/auth/cache/flush", "/signing-key/rotate", "/config/validate",
              "/plugins", "/plugins/x.tar.gz"]


def test_each_mutation_spends_its_documented_class():
    assert {p: mutation_class(P + p) for p in CONFIG_CLASS} == dict.fromkeys(CONFIG_CLASS, "config")
    assert {p: mutation_class(P + p) for p in CRUD_CLASS} == dict.fromkeys(CRUD_CLASS, "crud")
    assert mutation_class(P + "/plugins/inspect") == "plugin-inspect"


def test_fixed_one_minute_windows_per_principal_and_class():
    now = [1_000_020.0]
    lim = MutationLimiter(clock=lambda: now[0])
    assert [lim.check("admin", "config")[0] for _ in range(10)] == [True] * 10
    assert lim.check("admin", "config") == (False, True)        # the first refusal: audited
    assert lim.check("admin", "config") == (False, False)       # the next ones: not
    assert lim.check("admin", "crud") == (True, False)          # another class, its own budget
    assert lim.check("ci", "config") == (True, False)           # another principal, its own
    assert sum(lim.check("admin", "plugin-inspect")[0] for _ in range(40)) == 30
    assert sum(lim.check("admin", "crud")[0] for _ in range(100)) == 59
    now[0] = 1_000_079.9                    # the same window ([1_000_020, 1_000_080): now - now % 60)
    assert lim.check("admin", "config")[0] is False
    now[0] = 1_000_080.0                                        # the next one: refilled
    assert lim.check("admin", "config") == (True, False)
    assert lim.check("admin", "forbidden") == (False, True)     # a 403: audited once a window
    assert lim.check("admin", "forbidden") == (False, False)


def test_scope_matrix():
    assert required_scope("GET", P + "/keys") == "read-only"
    assert required_scope("HEAD", P + "/audit") == "read-only"
    assert required_scope("POST", P + "/config/validate") == "read-only"
    assert required_scope("POST", P + "/plugins/inspect") == "read-only"
    for method in ("POST", "PUT", "PATCH", "DELETE", "PURGE", "OPTIONS"):
        assert required_scope(method, P + "/keys") == "full", method
    assert required_scope("POST", P + "/config/apply") == "full"


def test_cursors_are_the_rust_gateways_and_refuse_foreign_ones():
    assert encode_cursor(200) == b"o:200".hex() == "6f3a323030"
    assert decode_cursor(encode_cursor(12345)) == 12345
    for bad in ("", "!!", "6f3a", "6f3a32303", "7a3a3130", b"o:-1".hex(), b"o:1x".hex(), "zz"):
        assert decode_cursor(bad) is None, bad


def test_audit_digest_and_chain_check():
    h1 = record_hash("", 1, 1700000000, "key.create", "key:vk_1", "applied", "admin")
    assert h1 == hashlib.sha256(b"|1|1700000000|key.create|key:vk_1|applied|admin").hexdigest()
    rows = []
    prev = ""
    for seq, action in enumerate(("key.create", "key.patch", "key.delete"), 1):
        r = {"seq": seq, "ts": 1700000000 + seq, "action": action, "resource": "key:vk_1",
             "outcome": "applied", "principal": "admin", "prev_hash": prev}
        r["hash"] = prev = record_hash(r["prev_hash"], r["seq"], r["ts"], r["action"],
                                       r["resource"], r["outcome"], r["principal"])
        rows.append(r)
    assert verify(rows) is None
    tampered = [dict(r) for r in rows]
    tampered[1]["principal"] = "someone-else"
    assert verify(tampered) == 2
    assert verify([rows[0], rows[2]]) == 3          # a removed row breaks the link
