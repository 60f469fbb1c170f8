"""cbusbar/respledger.pyx: the Valkey ledger's request-path bookkeeping in C, against the layout
busbar/governance/redis_store.py documents: the check tuple's field order is model.py's, the
ledger keys are ledger_key's, and the pending writes, the settlement script's arguments and the
admission frame are what the scripts take (their effect in Redis: tests/busbar/governance)."""
from __future__ import annotations

from busbar.governance import model
from busbar.governance.model import Usage, day_epoch
from busbar.governance.redis_store import ADMIT_LUA, EXPIRE_MARGIN, SCHEMA_VERSION, ledger_key
from cbusbar.resp import RespParser, encode_command
from cbusbar.respledger import LedgerLayout, Writes

P = "bb:"


def test_the_check_layout_is_models():
    assert (model.C_BUCKET, model.C_KIND, model.C_LIMIT, model.C_CHARGE, model.C_WINDOW,
            model.C_ROLL, model.C_GROUP, model.C_PER) == tuple(range(8))


def test_keys_and_the_admission_frame():
    lay = LedgerLayout(P, EXPIRE_MARGIN, day_epoch)
    rate = ("group:g@minute", "requests", 10, 1, 1700000040, 12.2, "g", "minute")
    budget = ("group:g@minute", "budget_usd", 500, 7, 1700000040, 12.2, "g", "minute")
    day = ("group:o@day", "budget_usd", 900, 7, 1699920000, 3000.0, "o", "day")
    conc = ("group:g@concurrent", "concurrent", 3, 1, 0, None, "g", None)
    for c in (rate, day, conc):
        assert lay.key(c) == ledger_key(P, c)
        assert lay.key(c) is lay.key(c)                  # remembered
    frame, lkeys = lay.admit(b"f" * 40, [rate, budget, day, conc], 7, "bb:bb:rates:x")
    assert lkeys == [ledger_key(P, c) for c in (rate, budget, day, conc)]
    keys = [ledger_key(P, rate), ledger_key(P, day), ledger_key(P, conc), "bb:bb:rates:x"]
    args = [2, 1,
            13 + EXPIRE_MARGIN, 7,     # the minute ledger: ttl to the roll + margin, reserve 7
            0, 7,                      # the day ledger: kept (no ttl), reserve 7
            "r", 1, 10, "b", 1, 500, "b", 2, 900, "c", 3, 3]
    assert frame == encode_command([b"EVALSHA", b"f" * 40, len(keys)] + keys + args)
    assert RespParser().feed(frame)  # (a frame parses as an array: the test's own sanity)
    assert "HGETALL" in ADMIT_LUA


def test_settle_writes_and_the_script():
    lay = LedgerLayout(P, EXPIRE_MARGIN, day_epoch)
    rate = ("group:g@minute", "requests", 10, 1, 1700000040, 12.2, "g", "minute")
    budget = ("group:g@total", "budget_usd", 500, 7, 0, None, "g", "total")
    conc = ("group:g@concurrent", "concurrent", 3, 1, 0, None, "g", None)
    w = Writes()
    assert not w
    u = Usage("2023-11-14", "vk_a|b\\c", "g", "m", None, 1, 5, 0, 2, 0, 1, "prov")
    lay.settle(w, [rate, budget, conc, conc], 7, u, False)
    k_rate, k_budget, k_conc = (ledger_key(P, c) for c in (rate, budget, conc))
    assert w.hashes[k_rate] == [13 + EXPIRE_MARGIN, {
        "m:m:input": [5, True], "m:m:cache_read": [2, True], "billable_requests": [-1, True]}]
    assert w.hashes[k_budget] == [0, {
        "m:m:input": [5, True], "m:m:cache_read": [2, True], "billable_requests": [-1, True],
        "bb:reserved": [-7, True]}]
    assert w.gauges == {k_conc: -1}                     # one slot back, however often listed
    own = "bb:usage:vk_a|b\\c:0"
    assert w.hashes[own] == [0, {"requests": [1, True], "m:m:input": [5, True],
                                 "m:m:cache_read": [2, True]}]
    e = day_epoch("2023-11-14")
    row = "bb:metering:%d:vk_a\\|b\\\\c|m|prov" % e
    assert w.rows == {row: ("bb:metering:%d" % e, "vk_a|b\\c", "m", "prov", "g")}
    assert w.hashes[row] == [0, {"requests": [1, False], "tokens_input": [5, False],
                                 "tokens_cache_read": [2, False]}]

    other = Writes()
    other.hinc(k_rate, "billable_requests", 1, True, 0)     # cancels out: left out of the script
    other.gauge(k_conc, 1)
    w.merge(other)
    keys, args = w.script(P, SCHEMA_VERSION)
    # the row's counts as a hash, then its attribution as a metering row
    assert keys == [k_rate, k_budget, own, row, row, "bb:schema"]
    assert args[:3] == [4, 0, 1]                        # the gauge nets to 0: not sent
    assert args[3:5] == [13 + EXPIRE_MARGIN, 2]
    assert args[-6:] == ["bb:metering:%d" % e, "vk_a|b\\c", "m", "prov", "g", SCHEMA_VERSION]


def test_settle_without_a_model_and_the_names_remembered():
    lay = LedgerLayout(P, EXPIRE_MARGIN, day_epoch)
    w = Writes()
    u = Usage("2023-11-14", "vk_a", None, None, None, 1, 4, 1, 0, 0, 1, None)
    lay.settle(w, [], 0, u, True)
    lay.settle(w, (), 0, u, True)
    e = day_epoch("2023-11-14")
    row = "bb:metering:%d:vk_a||" % e
    assert w.hashes["bb:usage:vk_a:0"] == [0, {"requests": [2, True], "billable_requests": [2, True]}]
    assert w.hashes[row] == [0, {"requests": [2, False], "tokens_input": [8, False],
                                 "tokens_output": [2, False], "billable_requests": [2, False]}]
    assert w.rows == {row: ("bb:metering:%d" % e, "vk_a", "", "", "")}
    lay.settle(w, [], 0, None, True)                    # no usage: nothing more
    assert len(w.hashes) == 2
