# cython: language_level=3
"""The Valkey ledger's per-request bookkeeping (busbar/governance/redis_store.py's RedisLedger) in
typed Cython: the admission script's command for a request's checks, and a settlement's writes
into the pending batch (`Writes`, in the shape SETTLE_LUA takes). Same layout and semantics as
the Python it replaces; the store module keeps the scripts, the layout's documentation and the
fail_mode open local count."""

from libc.math cimport ceil

from cbusbar.resp import encode_script

# A check, as busbar/governance/model.py lays it out (C_BUCKET .. C_PER; a test holds them equal).
cdef enum:
    C_BUCKET = 0
    C_KIND = 1
    C_LIMIT = 2
    C_CHARGE = 3
    C_WINDOW = 4
    C_ROLL = 5
    C_GROUP = 6
    C_PER = 7

TIERS = ("input", "output", "cache_read", "cache_write")
cdef tuple _TIERS = TIERS
cdef tuple _METER_FIELDS = ("requests", "tokens_input", "tokens_output", "tokens_cache_read",
                            "tokens_cache_write", "billable_requests")
cdef dict _KIND_CODE = {"requests": "r", "tokens": "t", "budget_usd": "b", "concurrent": "c"}
# Memo sizes: the keys and fields of the groups, windows, models and days in use; dropped whole
# when a window roll (or a flood of distinct models) has filled one past this.
cdef Py_ssize_t MEMO_MAX = 4096


cdef str _esc(str s):
    """A metering row key component: `\\` and the `|` separator escaped (the Rust store's rule)."""
    return s.replace("\\", "\\\\").replace("|", "\\|")


cdef class Writes:
    """Pending increments: hash fields (with a floor-at-0 flag and the hash's ttl), gauges, and
    metering rows' attribution."""

    cdef public dict hashes     # key -> [ttl, {field: [delta, floor]}]
    cdef public dict gauges     # key -> delta
    cdef public dict rows       # row key -> (day set key, key id, model, provider, group)

    def __cinit__(self):
        self.hashes = {}
        self.gauges = {}
        self.rows = {}

    def __bool__(self):
        return bool(self.hashes) or bool(self.gauges) or bool(self.rows)

    cpdef hinc(self, str key, str field, object delta, bint floor=False, object ttl=0):
        cdef list h
        cdef list cur
        if not delta:
            return
        h = self.hashes.get(key)
        if h is None:
            h = [ttl, {}]
            self.hashes[key] = h
        elif ttl and not h[0]:
            h[0] = ttl
        cur = (<dict>h[1]).get(field)
        if cur is None:
            (<dict>h[1])[field] = [delta, floor]
        else:
            cur[0] = cur[0] + delta

    cpdef gauge(self, str key, object delta):
        self.gauges[key] = self.gauges.get(key, 0) + delta

    cpdef meter(self, str p, object bucket, str key_id, object group, str model, str provider,
                counts):
        """One usage row's counts (model.USAGE_FIELDS order) into its metering row."""
        cdef str row = "%smetering:%d:%s|%s|%s" % (p, bucket, _esc(key_id), _esc(model),
                                                   _esc(provider))
        if row not in self.rows:
            self.rows[row] = ("%smetering:%d" % (p, bucket), key_id, model, provider, group or "")
        for field, v in zip(_METER_FIELDS, counts):
            self.hinc(row, field, v)

    cpdef ledger(self, str p, str bucket, object start, object requests, object billable,
                 dict models, object ttl=0):
        cdef str k = "%susage:%s:%d" % (p, bucket, start)
        self.hinc(k, "requests", requests, True, ttl)
        self.hinc(k, "billable_requests", billable, True, ttl)
        for model, t in models.items():
            for tier, v in zip(_TIERS, t):
                self.hinc(k, "m:%s:%s" % (model, tier), v, True, ttl)

    cpdef merge(self, Writes other):
        for k, (ttl, fields) in other.hashes.items():
            for f, (d, floor) in fields.items():
                self.hinc(k, f, d, floor, ttl)
        for k, d in other.gauges.items():
            self.gauge(k, d)
        for k, v in other.rows.items():
            if k not in self.rows:
                self.rows[k] = v

    cpdef tuple script(self, str p, object schema_version):
        """(keys, args) of SETTLE_LUA."""
        cdef list keys = []
        cdef list args = [0, 0, 0]
        cdef Py_ssize_t nh = 0, ng = 0, nm = 0, live
        cdef list fl
        for k, (ttl, fields) in self.hashes.items():
            live = 0
            fl = []
            for f, (d, floor) in (<dict>fields).items():
                if d:
                    fl += (f, d, 1 if floor else 0)
                    live += 1
            if not live:
                continue
            keys.append(k)
            args += (ttl, live)
            args += fl
            nh += 1
        for k, d in self.gauges.items():
            if d:
                keys.append(k)
                args.append(d)
                ng += 1
        for k, row in self.rows.items():
            keys.append(k)
            args += row
            nm += 1
        keys.append(p + "schema")
        args.append(schema_version)
        args[0] = nh
        args[1] = ng
        args[2] = nm
        return keys, args


cdef class LedgerLayout:
    """One ledger's key names and the commands of its request path, with the names remembered."""

    cdef readonly str prefix
    cdef object margin          # EXPIRE_MARGIN: a minute or hour ledger lives this long past its roll
    cdef object day_epoch       # model.day_epoch
    cdef dict _keys             # (bucket, window) or (group, -1) -> ledger key
    cdef dict _mfields          # model -> its four `m:<model>:<tier>` fields
    cdef dict _rows             # (key id, model, provider, day) -> (own ledger, metering row,
    #                             its day's set): a settle's names

    def __cinit__(self, str prefix, object margin, object day_epoch):
        self.prefix = prefix
        self.margin = margin
        self.day_epoch = day_epoch
        self._keys = {}
        self._mfields = {}
        self._rows = {}

    cpdef str key(self, tuple c):
        """The Redis key a check counts in: its bucket's ledger hash, or its group's gauge."""
        cdef object mk
        cdef str k
        if c[C_KIND] == "concurrent":
            mk = (c[C_GROUP], -1)
        else:
            mk = (c[C_BUCKET], c[C_WINDOW])
        k = self._keys.get(mk)
        if k is None:
            if len(self._keys) > MEMO_MAX:
                self._keys.clear()
            if c[C_KIND] == "concurrent":
                k = "%sbb:conc:%s" % (self.prefix, c[C_GROUP])
            else:
                k = "%susage:%s:%d" % (self.prefix, c[C_BUCKET], c[C_WINDOW])
            self._keys[mk] = k
        return k

    cdef object _ttl(self, tuple c):
        """Seconds a minute or hour ledger hash lives: to its window's roll plus the margin; 0 (no
        expiry) for the day, month and total ones, which the Rust store keeps."""
        per = c[C_PER]
        roll = c[C_ROLL]
        if roll is not None and (per == "minute" or per == "hour"):
            return <long long>ceil(<double>roll) + self.margin
        return 0

    def admit(self, bytes sha, object checks, object reserve, str rates_key):
        """(the EVALSHA frame of ADMIT_LUA for these checks, each check's ledger key)."""
        cdef list hashes = [], gauges = [], lkeys = [], keys, args
        cdef dict index = {}, ttl = {}, res = {}, order = {}
        cdef tuple c
        cdef str k
        cdef Py_ssize_t i
        for c in checks:
            k = self.key(c)
            lkeys.append(k)
            if k not in index:
                if c[C_KIND] == "concurrent":
                    gauges.append(k)
                else:
                    hashes.append(k)
                    ttl[k] = self._ttl(c)
                index[k] = None
            if c[C_KIND] == "budget_usd":
                res[k] = reserve
        keys = hashes + gauges
        for i in range(len(keys)):
            order[keys[i]] = i + 1
        keys.append(rates_key)
        args = [len(hashes), len(gauges)]
        for k in hashes:
            args += (ttl[k], res.get(k, 0))
        i = 0
        for c in checks:
            args += (_KIND_CODE[c[C_KIND]], order[lkeys[i]], c[C_LIMIT])
            i += 1
        return encode_script(sha, keys, args), lkeys

    cpdef settle(self, Writes w, object checks, object reserve, object usage, bint ok):
        """A request's end, into `w`: its tokens into every ledger bucket of its checks and into
        the key's own bucket, its reservation given back, a non-2xx answer off the billable
        count, its concurrency slots back, and its metering row."""
        cdef object inp = 0, out = 0, cr = 0, cw = 0
        cdef str model = ""
        cdef tuple tokens, mf = None, c
        cdef set done = set()
        cdef str k, kind
        cdef object ttl
        cdef str p = self.prefix
        if usage is not None:
            inp, out = usage.input_tokens, usage.output_tokens
            cr, cw = usage.cache_read_tokens, usage.cache_write_tokens
            model = usage.model or ""
        tokens = (inp, out, cr, cw)
        if model:
            mf = self._mfields.get(model)
            if mf is None:
                if len(self._mfields) > MEMO_MAX:
                    self._mfields.clear()
                mf = tuple(["m:%s:%s" % (model, t) for t in _TIERS])
                self._mfields[model] = mf
        for c in checks:
            k = self.key(c)
            kind = c[C_KIND]
            if kind == "concurrent":
                if k not in done:
                    w.gauge(k, -1)
                    done.add(k)
                continue
            ttl = self._ttl(c)
            if k not in done:
                done.add(k)
                if mf is not None:
                    for i in range(4):
                        if tokens[i]:
                            w.hinc(k, mf[i], tokens[i], True, ttl)
                if not ok:
                    w.hinc(k, "billable_requests", -1, True, ttl)
            if kind == "budget_usd" and (k, "b") not in done:
                done.add((k, "b"))
                if reserve:
                    w.hinc(k, "bb:reserved", -reserve, True, ttl)
        if usage is None:
            return
        key_id = usage.key_id
        provider = usage.provider or ""
        rk = (key_id, model, provider, usage.day)
        names = self._rows.get(rk)
        if names is None:
            epoch = self.day_epoch(usage.day)
            if len(self._rows) > MEMO_MAX:
                self._rows.clear()
            names = self._rows[rk] = (
                "%susage:%s:0" % (p, key_id),
                "%smetering:%d:%s|%s|%s" % (p, epoch, _esc(key_id), _esc(model), _esc(provider)),
                "%smetering:%d" % (p, epoch))
        own, row, dayset = names
        # the key's own bucket (as Writes.ledger writes it): the request, billable when 2xx,
        # the model's tokens
        w.hinc(own, "requests", 1, True, 0)
        if ok:
            w.hinc(own, "billable_requests", 1, True, 0)
        if mf is not None:
            for i in range(4):
                if tokens[i]:
                    w.hinc(own, mf[i], tokens[i], True, 0)
        # its metering row (as Writes.meter writes it)
        if row not in w.rows:
            w.rows[row] = (dayset, key_id, model, provider, usage.group or "")
        w.hinc(row, "requests", 1)
        for i in range(4):
            if tokens[i]:
                w.hinc(row, _METER_FIELDS[i + 1], tokens[i])
        if ok:
            w.hinc(row, "billable_requests", 1)
