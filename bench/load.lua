-- wrk script for bench/run.py: every request body is unique, every response is checked.
--
-- Environment (set by run.py):
--   BENCH_BODY     file holding the request body template; the marker @SEQ@ is replaced per request
--                  by "<thread>x<counter>", so no two bodies of a run are equal (no cache can answer)
--   BENCH_PATH     request path (e.g. /v1/chat/completions)
--   BENCH_HEADERS  file of "Name: value" lines sent with every request
--   BENCH_OUT      prefix of the result files done() writes: <prefix>.json and <prefix>.dur
--
-- Each thread keeps the Server-Timing busbar;dur of every response and counts non-2xx statuses;
-- done() gathers them through thread:get, as wrk's threads each run their own Lua state.

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local template = read_file(os.getenv("BENCH_BODY"))
local cut = string.find(template, "@SEQ@", 1, true)
assert(cut, "body template has no @SEQ@ marker")
local head, tail = string.sub(template, 1, cut - 1), string.sub(template, cut + 5)
local path = os.getenv("BENCH_PATH")
local headers = {}
for line in string.gmatch(read_file(os.getenv("BENCH_HEADERS")), "[^\r\n]+") do
  local name, value = string.match(line, "^([^:]+):%s*(.*)$")
  if name then headers[name] = value end
end

-- Main-thread state: the thread objects, to gather from in done().
local threads = {}
local next_id = 0

function setup(thread)
  next_id = next_id + 1
  thread:set("tid", next_id)
  table.insert(threads, thread)
end

-- Per-thread state (each thread's Lua state runs init/request/response).
local seq = 0
local prefix = ""
durs = {}
ndur = 0
non2xx = 0
first_bad = ""

function init(args)
  prefix = tostring(tid) .. "x"
end

function request()
  seq = seq + 1
  return wrk.format("POST", path, headers, head .. prefix .. seq .. tail)
end

function response(status, hdrs, body)
  if status < 200 or status > 299 then
    non2xx = non2xx + 1
    if first_bad == "" then
      first_bad = tostring(status) .. " " .. string.sub(body or "", 1, 300)
    end
  end
  local st = hdrs["Server-Timing"] or hdrs["server-timing"]
  if st then
    local d = string.match(st, "busbar;dur=([%d%.]+)")
    if d then
      ndur = ndur + 1
      durs[ndur] = tonumber(d)
    end
  end
end

local function esc(s)
  return (string.gsub(s, '[%c"\\]', function(c) return string.format("\\u%04x", string.byte(c)) end))
end

function done(summary, latency, requests)
  local out = os.getenv("BENCH_OUT")
  local fd = assert(io.open(out .. ".dur", "w"))
  local bad, bad_text, ndurs = 0, "", 0
  for _, t in ipairs(threads) do
    bad = bad + (t:get("non2xx") or 0)
    local fb = t:get("first_bad") or ""
    if bad_text == "" and fb ~= "" then bad_text = fb end
    local d = t:get("durs") or {}
    local n = t:get("ndur") or 0
    for i = 1, n do
      fd:write(string.format("%.3f\n", d[i]))
    end
    ndurs = ndurs + n
  end
  fd:close()
  local e = summary.errors
  local f = assert(io.open(out .. ".json", "w"))
  f:write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "non2xx": %d, "first_bad": "%s", ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "p999": %d, "max": %d, "mean": %.1f}, ' ..
    '"server_timing_samples": %d}\n',
    summary.requests, summary.duration, summary.bytes, bad, esc(bad_text),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean, ndurs))
  f:close()
end
