"""cbusbar/ledger.pyx: admission of a Plan all or nothing, windows that roll, settlement into the
window a request was admitted in, prices equal to Rate.nano to the nano-dollar, the reservation's
output cap read from the body's scan, and the gate's caches (verified tokens, usage rows)."""
from __future__ import annotations

import random

from cbusbar.framing import scan_top
from cbusbar.ir import Usage
from cbusbar.ledger import (DENIED_FULL, PERIOD_INDEX, Admission, Credentials, LimitTable, Pass,
                            Plan, Price, Pricing, Ticket, UsageRows)

from busbar.engine.translate import CODECS
from busbar.governance.gate import requested_max_tokens
from busbar.governance.model import KeyRecord, Rate, window

T0 = 1_764_764_400.0        # 2025-12-03 12:20:00 UTC


def _chain(*limits):
    """(bucket, kind, amount, per, group) per limit, as the gate's chain()."""
    return tuple(("g#%d:%s:%s" % (i, kind, per), kind, amount, per, "g")
                 for i, (kind, amount, per) in enumerate(limits))


def _value(table, plan, i, now):
    bucket, _, _, per, _ = plan.chain[i]
    return table.value(bucket, window(per, now)[0])


def test_all_or_nothing_and_each_kinds_rule():
    table = LimitTable(64)
    adm = Admission(table, window)
    plan = Plan(_chain(("requests", 3, "minute"), ("budget_usd", 100, "day"),
                       ("concurrent", 2, None), ("tokens", 50, "hour")))
    assert plan.n == 4 and plan.has_budget
    t1 = adm.admit(plan, 40, T0)
    t2 = adm.admit(plan, 40, T0)
    assert isinstance(t1, Ticket) and isinstance(t2, Ticket)
    assert t1.charges() == [1, 40, 1, 0]
    # a third: the budget (80 + 40 > 100) refuses, and nothing of it is charged
    assert adm.admit(plan, 40, T0) == 1
    assert [_value(table, plan, i, T0) for i in range(4)] == [2, 80, 2, 0]
    # concurrency full once the budget fits again
    assert adm.admit(plan, 10, T0) == 2
    # settlement: the slot back, the reservation replaced by the cost, tokens post-paid
    t1.prices = {"m": Price(Rate(input=1.0, output=2.0))}   # 1000 / 2000 nano per token
    adm.settle(t1, Usage(0, 0, 0, 0, 0), "m")
    assert [_value(table, plan, i, T0) for i in range(4)] == [2, 40, 1, 0]
    t3 = adm.admit(plan, 10, T0)
    assert isinstance(t3, Ticket)
    assert adm.admit(plan, 0, T0) == 0                       # 3 requests this minute
    t3.prices = {}
    adm.settle(t3, Usage(30, 25, 0, 0, 0), "m")              # unpriced lane: costs 0
    assert [_value(table, plan, i, T0) for i in range(4)] == [3, 40, 1, 55]
    # tokens: post-paid, so at 55 >= 50 the next request is refused (in the next minute)
    assert adm.admit(plan, 0, T0 + 60) == 3


def test_windows_roll_and_settlement_keeps_the_fresh_count():
    table = LimitTable(64)
    adm = Admission(table, window)
    plan = Plan(_chain(("requests", 1, "minute"), ("tokens", 10, "minute")))
    t = adm.admit(plan, 0, T0 + 59.5)
    assert isinstance(t, Ticket) and adm.admit(plan, 0, T0 + 59.6) == 0
    assert abs(adm.roll(PERIOD_INDEX["minute"], T0 + 59.6) - 0.4) < 1e-6
    t2 = adm.admit(plan, 0, T0 + 60.1)                       # a new minute
    assert isinstance(t2, Ticket)
    adm.settle(t, Usage(7, 0, 0, 0, 0), "m")                 # taken in the old window: dropped
    assert _value(table, plan, 1, T0 + 60.1) == 0
    adm.settle(t2, Usage(7, 5, 0, 0, 0), "m")
    assert _value(table, plan, 1, T0 + 60.1) == 12
    # a tokens limit counts every tier, cache reads and writes too (the Rust ledger's total)
    t3 = adm.admit(plan, 0, T0 + 120.1)
    adm.settle(t3, Usage(1, 2, 30, 400, 0), "m")
    assert _value(table, plan, 1, T0 + 120.1) == 433
    assert adm.roll(PERIOD_INDEX[None], T0) is None


def test_a_pass_takes_its_reservation_and_carries_pool_and_prices():
    table = LimitTable(64)
    adm = Admission(table, window)
    codec = CODECS["anthropic"]
    body = b'{"model":"m","max_tokens":10,"messages":[]}'
    spans = scan_top(body, codec.SCAN_KEYS)
    prices = {"m": Price(Rate(1.0, 2.0))}
    plan = Plan(_chain(("budget_usd", 10 ** 9, "month"), ("requests", 5, "minute")))
    p = Pass(plan, Pricing([(prices["m"], 4096)]), "pool-a", prices)
    t = adm.take(p, body, spans, codec, False, T0, 3, requested_max_tokens)
    est = len(body) // 3 + 1
    assert t.reserve == Rate(1.0, 2.0).nano(est, 10) and t.pool == "pool-a" and t.prices is prices
    assert _value(table, plan, 0, T0) == t.reserve
    adm.settle(t, Usage(3, 4, 0, 0, 0), "m")
    assert _value(table, plan, 0, T0) == Rate(1.0, 2.0).nano(3, 4)
    # no limits to take: admitted without a ticket
    assert adm.take(Pass(Plan(()), None, "pool-a", None), body, spans, codec, False, T0, 3,
                    requested_max_tokens) is None
    assert adm.take(Pass(None, None, "pool-a", None), body, spans, codec, False, T0, 3,
                    requested_max_tokens) is None


def test_a_full_table_refuses():
    table = LimitTable(16)
    adm = Admission(table, window)
    for i in range(16):
        assert isinstance(adm.admit(Plan((("b%d" % i, "requests", 5, "total", "g"),)), 0, T0),
                          Ticket)
    assert adm.admit(Plan((("another", "requests", 5, "total", "g"),)), 0, T0) == DENIED_FULL


def test_price_is_rate_nano_exactly():
    rng = random.Random(7)
    for _ in range(20000):
        rate = Rate(*(rng.choice((0.0, 0.075, 0.1, 0.3, 1.25, 2.5, 3.0, 15.0, 75.0,
                                  rng.uniform(0, 100))) for _ in range(4)))
        args = [rng.choice((0, 1, 7, 999, 123457, rng.randrange(0, 10 ** 7))) for _ in range(4)]
        assert Price(rate).nano(*args) == rate.nano(*args), (rate.public(), args)


def test_reservation_reads_the_output_cap_as_the_gate_does():
    cheap, dear = Rate(1.0, 2.0), Rate(3.0, 15.0)
    pricing = Pricing([(Price(cheap), 4096), (Price(dear), 100)])
    for proto in ("anthropic", "openai", "gemini", "bedrock", "cohere", "responses"):
        codec = CODECS[proto]
        for cap in (b"", b'"max_tokens":321,', b'"max_tokens":0,', b'"max_tokens":"9",',
                    b'"max_tokens":123456789012,', b'"generationConfig":{"maxOutputTokens":77},',
                    b'"inferenceConfig":{"maxTokens":55},', b'"max_output_tokens":11,'):
            body = b'{' + cap + b'"model":"m","messages":[]}'
            spans = scan_top(body, codec.SCAN_KEYS)
            max_out = requested_max_tokens(codec, body, spans)
            est = len(body) // 3 + 1
            want = max(cheap.nano(est, max_out or 4096), dear.nano(est, max_out or 100))
            assert pricing.reserve(body, spans, codec, False, 3, requested_max_tokens) == want
            assert pricing.reserve(body, spans, codec, True, 3, requested_max_tokens) == \
                max(cheap.nano(est, 0), dear.nano(est, 0))


def test_credentials_by_the_header_they_came_in():
    c = Credentials()
    sk = b"k" * 32
    rec = KeyRecord("vk_1", "n", "g", gen=2)
    keys = {"vk_1": rec}
    bearer = {b"authorization": b"Bearer bbk_x"}
    c.remember(bearer, ("vk_1", None, 2, sk), 10)
    assert c.accept(bearer, sk, keys, T0) is rec
    assert c.accept(bearer, b"other", keys, T0) is None                  # another signing key
    assert c.accept({b"x-api-key": b"Bearer bbk_x"}, sk, keys, T0) is None
    c.remember({b"authorization": b"Basic abc"}, ("vk_1", None, 2, sk), 10)   # not a token
    assert c.accept({b"authorization": b"Basic abc"}, sk, keys, T0) is None
    c.remember({b"x-api-key": b"bbk_y"}, ("vk_1", T0 + 5, 2, sk), 10)
    assert c.accept({b"x-goog-api-key": b"bbk_y"}, sk, keys, T0) is rec
    assert c.accept({b"x-api-key": b"bbk_y"}, sk, keys, T0 + 5) is None  # the token expired
    assert c.accept({b"authorization": b"x", b"x-api-key": b"bbk_y"}, sk, keys, T0) is None
    rec.gen = 3                                                          # rotated
    assert c.accept(bearer, sk, keys, T0) is None
    rec.gen, rec.state = 2, "revoked"
    assert c.accept(bearer, sk, keys, T0) is None
    rec.state, rec.expires = "active", T0
    assert c.accept(bearer, sk, keys, T0) is None
    rec.expires = None
    assert c.accept(bearer, sk, {}, T0) is None                           # key dropped
    for i in range(12):
        c.remember({b"authorization": b"Bearer %d" % i}, ("vk_1", None, 2, sk), 10)
    assert len(c.by_auth) <= 10


def test_usage_rows_sum_per_day_key_model_pool():
    days = []

    class Rows(UsageRows):
        def schedule(self):
            self.handle = "scheduled"

    r = Rows(lambda now: days.append(now) or "2025-12-03")
    r.add("vk_1", "g", "m", "p", Usage(10, 2, 1, 0, 0))
    r.add("vk_1", "g", "m", "p", Usage(5, 3, 0, 4, 0))
    r.add("vk_1", "g", "m", "p", Usage(1, 0, 0, 0, 0), False)      # answered non-2xx
    r.add("vk_2", None, "m", "p", None)
    assert r.handle == "scheduled" and len(days) == 1
    assert r.rows == {("2025-12-03", "vk_1", "g", "m", "p"): [3, 16, 5, 1, 4, 2],
                      ("2025-12-03", "vk_2", None, "m", "p"): [1, 0, 0, 0, 0, 1]}
