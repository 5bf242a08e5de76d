package limiter

import (
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// luaTokens is prepended to the scripts that touch token buckets (after luaCommon).
//
// The token hash (tokenKey) holds three buckets, each under a one-letter field prefix: 'i' input
// tokens, 'o' output tokens, 't' both together (OpenAI's token limit). Per bucket b:
//   - schedule: b..'tat' (GCRA theoretical arrival time, µs, fractional), b..'ts' (µs per token
//     tat is expressed in), b..'bs' (capacity it is expressed in), b..'full' (last time known
//     full, µs);
//   - refund bounds: b..'R' (tokens charged so far, never decreased: grants and charges) and b..'k'
//     (cmsgpack array id1, M1, Rb1, id2, ...: a grant or a push of tat, its model time M and R
//     before it, oldest first; see kquery);
//   - learned: b..'L' (capacity), b..'lo'/b..'hi' (bounds on the refill rate, tokens/s),
//     b..'lupd' (last header update, µs);
//   - configured: b..'cr' (capacity last passed to ReserveCost) and b..'cupd' (when).
//
// Shared fields: 'tid' (counter of grants and pushes), 'tail' (send time of the latest slot the
// tokens pushed beyond the token horizon, µs).
const luaTokens = `
local TB = {'i', 'o', 't'}
local TNAME = {i = 'input_tokens', o = 'output_tokens', t = 'tokens'}
local KMAX = 32
local TFIELDS = {'tat', 'ts', 'bs', 'full', 'R', 'k', 'L', 'lo', 'hi', 'lupd', 'cr', 'cupd'}

-- tload reads the buckets of the token hash tk (all three, in TB order). Each keeps what was
-- loaded in x.o, so that tsave writes only what changed.
local function tload(tk)
  local names = {}
  for _, b in ipairs(TB) do
    for _, f in ipairs(TFIELDS) do names[#names + 1] = b .. f end
  end
  local s = redis.call('HMGET', tk, unpack(names))
  local xs = {}
  for i, b in ipairs(TB) do
    local o = (i - 1) * #TFIELDS
    local x = {b = b, o = {}}
    for j, f in ipairs(TFIELDS) do
      if f == 'k' then x[f] = s[o + j] or '' else x[f] = num(s[o + j]) end
      x.o[f] = x[f]
    end
    x.R = x.R or 0
    xs[i] = x
  end
  return xs
end

-- tsave writes back the fields of the buckets xs that changed since tload (absent: deleted).
-- Times and counters are written with %.17g (fractional µs are kept).
local function tsave(tk, xs)
  local set, del = {}, {}
  for _, x in ipairs(xs) do
    for _, f in ipairs(TFIELDS) do
      local v = x[f]
      if f == 'R' and v == 0 then v = nil end
      if f == 'k' and v == '' then v = nil end
      if v ~= x.o[f] and not (f == 'k' and v == nil and x.o[f] == '') then
        if v == nil then
          del[#del + 1] = x.b .. f
        else
          set[#set + 1] = x.b .. f
          if f == 'k' then set[#set + 1] = v else set[#set + 1] = fmt(v) end
        end
      end
    end
  end
  if #set > 0 then redis.call('HSET', tk, unpack(set)) end
  if #del > 0 then redis.call('HDEL', tk, unpack(del)) end
end

-- tkeep sets the expiry of the token hash and the grants hash: learnttl after the last bucket is
-- full again.
local function tkeep(tk, gk, now, learnttl, xs)
  local keep = learnttl
  for _, x in ipairs(xs) do
    if x.tat ~= nil and x.tat - now + learnttl > keep then keep = x.tat - now + learnttl end
  end
  redis.call('PEXPIRE', tk, math.ceil(keep / 1000))
  if gk ~= nil then redis.call('PEXPIRE', gk, math.ceil(keep / 1000)) end
end

-- texpress re-expresses x's schedule when its spacing x.T or capacity x.C changed: the tokens in
-- use now stay in use (at the new spacing they take a different time to refill).
local function texpress(x, now)
  if x.ts ~= nil and x.tat ~= nil and x.tat > now and
      (math.abs(x.ts - x.T) > 1e-9 * x.T or x.bs ~= x.C) then
    x.tat = now + (x.tat - now) / x.ts * x.T
  end
  x.ts, x.bs = x.T, x.C
end

local function kparse(k)
  if k == '' then return {} end
  return cmsgpack.unpack(k)
end

-- kpush records that event id (a grant, or a push of tat) put tokens in the bucket from model
-- time m on, with R = rb tokens charged before it. Entries dominated by the new one (no later
-- model time, no fewer tokens before them) are dropped; beyond KMAX entries the oldest two are
-- merged into one that bounds both (a looser bound on refunds of the oldest grants).
local function kpush(x, id, m, rb)
  local l = kparse(x.k)
  local n = #l
  while n >= 3 and l[n - 1] <= m and l[n] >= rb do
    l[n], l[n - 1], l[n - 2] = nil, nil, nil
    n = n - 3
  end
  l[n + 1], l[n + 2], l[n + 3] = id, m, rb
  n = n + 3
  if n > 3 * KMAX then
    -- Merge the oldest half into one entry that bounds them all: the last one's id, the latest
    -- model time, the fewest tokens before (a looser bound on refunds of the oldest grants).
    local h = 3 * math.floor(KMAX / 2)
    local m2, rb2 = l[2], l[3]
    for i = 4, h, 3 do
      if l[i + 1] > m2 then m2 = l[i + 1] end
      if l[i + 2] < rb2 then rb2 = l[i + 2] end
    end
    local out = {l[h - 2], m2, rb2}
    for i = h + 1, n do out[#out + 1] = l[i] end
    l = out
  end
  x.k = cmsgpack.pack(l)
end

-- kquery bounds what the events after grant id alone imply for tat: GCRA gives
-- tat = max over events j of (M_j + tokens charged from j on * T), so a refund of r tokens to
-- grant id moves tat to max(tat - r*T, the same maximum over the events after it): slots already
-- handed out after it keep their tokens in the bucket. Charges since are counted in R, refunds
-- not, so the bound is conservative. nil: no event after id.
local function kquery(x, id)
  local best = nil
  local l = kparse(x.k)
  for i = 1, #l, 3 do
    if l[i] > id then
      local v = l[i + 1] + (x.R - l[i + 2]) * x.T
      if best == nil or v > best then best = v end
    end
  end
  return best
end
`

// kafter is how many tokens were charged to bucket x after grant id: R less the tokens charged
// before the first event after id (0 when there is none; merged entries keep the fewest tokens
// before them, so this never undercounts).
const luaKAfter = `
local function kafter(x, id)
  local l = kparse(x.k)
  for i = 1, #l, 3 do
    if l[i] > id then return math.max(x.R - l[i + 2], 0) end
  end
  return 0
end
`

// observeTokensScript learns the token buckets from one response's token headers.
//
// KEYS[1] token hash (see luaTokens), KEYS[2] grants hash (see reconcileScript).
// ARGV[1] now µs, or ""
// ARGV[2] learn TTL µs
// ARGV[3] rate margin (fraction)
// ARGV[4] token minute µs
// ARGV[5..11], [12..18], [19..25]: for the input, output and combined buckets: known 0|1, limit,
// remaining, remaining granularity (tokens; <= 1: rounded down), dtmax µs (latest the bucket can be
// full, measured from the send; 0 = no reset), dtmin µs (earliest, from the response), the send
// time as an offset from now (µs, <= 0).
// ARGV[26] the response's grant id (0: unknown).
// ARGV[27] grant records kept: a push takes an id of the grants' counter ('tid'), and drops the
// grant record that many ids back, as a grant does (so that every record goes, answered or not,
// once that many ids were handed out after it).
// Each known bucket: the capacity is the limit (a new value starts the rate bounds afresh); the
// deficit limit-remaining and the time to refill it bound the rate, as for requests; and unless
// the bucket is configured, the schedule is pushed to hold at least what the provider surely
// held when it evaluated the request (the deficit less its rounding, from the send on) plus the
// tokens granted after the response's grant (handed out, not yet seen by the provider; see kafter).
// Returns 1.
var observeTokensScript = redisscript.NewScript(luaCommon + luaTokens + luaKAfter + `
local tk = KEYS[1]
local now = clock(ARGV[1])
local learnttl, rmargin, tmin = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local grant = tonumber(ARGV[26]) or 0
local xs = tload(tk)
for i, b in ipairs(TB) do
  local o = 5 + (i - 1) * 7
  if ARGV[o] == '1' then
    local newL, rem, g = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3])
    local dtmax, dtmin, sent = tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5]), now + tonumber(ARGV[o + 6])
    local x = xs[i]
    if x.lupd == nil or now - x.lupd > learnttl then x.L, x.lo, x.hi = nil, nil, nil end
    if x.L ~= nil and x.L ~= newL then x.lo, x.hi = nil, nil end
    x.L, x.lupd = newL, now
    local d = newL - rem
    -- deficit bounds: remaining is rounded down (g <= 1) or to the nearest g
    local dlo, dhi = math.max(d - 1, d / 2), d
    if g > 1 then dlo, dhi = d - g / 2, d + g / 2 end
    if d > 0 and dtmax > 0 then
      local loi, hii = nil, nil
      if dlo > 0 then loi = dlo * 1000000 / dtmax end
      if dtmin > 0 then hii = dhi * 1000000 / dtmin end
      if (x.lo ~= nil and hii ~= nil and hii < x.lo) or (x.hi ~= nil and loi ~= nil and loi > x.hi) then
        -- inconsistent with what we knew: the provider changed its rate; start over from here
        x.lo, x.hi = loi, hii
      else
        if loi ~= nil and (x.lo == nil or loi > x.lo) then x.lo = loi end
        if hii ~= nil and (x.hi == nil or hii < x.hi) then x.hi = hii end
      end
    end
    local configured = x.cupd ~= nil and now - x.cupd <= learnttl
    if not configured then
      x.C = newL
      x.rate = math.max(x.lo or 0, newL * 1000000 / tmin)
      x.T = 1000000 / x.rate * (1 + rmargin)
      texpress(x, now)
      local used = d - 1
      if g > 1 then used = d - g / 2 end
      if grant > 0 then used = used + kafter(x, grant) end
      if used > 0 then
        local floor = sent + used * x.T
        if x.tat == nil or x.tat < floor then
          local id = redis.call('HINCRBY', tk, 'tid', 1)
          redis.call('HDEL', KEYS[2], id - tonumber(ARGV[27]))
          kpush(x, id, floor, x.R)
          x.tat = floor
        end
      end
    end
  end
end
tsave(tk, xs)
tkeep(tk, nil, now, learnttl, xs)
return 1
`)

// reconcileScript trues a token grant up to what the provider reported.
//
// KEYS[1] token hash (see luaTokens). KEYS[2] grants hash: field <grant id> = "in out both", the
// tokens charged to each bucket (0: not charged); the oldest records beyond the number kept are
// deleted as new grants are made, a reconciled one at once (so a second Reconcile is a no-op).
// ARGV[1] now µs, or ""
// ARGV[2] grant id
// ARGV[3] actual input tokens
// ARGV[4] actual output tokens
// ARGV[5] learn TTL µs
// A charge (actual > charged) moves the bucket's tat later by the difference; a refund moves it
// earlier, but never before what the slots handed out after the grant imply (see kquery).
// Returns {found 0|1, charged in, charged out, charged both}.
var reconcileScript = redisscript.NewScript(luaCommon + luaTokens + `
local tk, gk = KEYS[1], KEYS[2]
local now = clock(ARGV[1])
local rec = redis.call('HGET', gk, ARGV[2])
if not rec then return {0, 0, 0, 0} end
redis.call('HDEL', gk, ARGV[2])
local id = tonumber(ARGV[2])
local charged = {}
for v in string.gmatch(rec, '%S+') do charged[#charged + 1] = tonumber(v) end
local ai, ao = tonumber(ARGV[3]), tonumber(ARGV[4])
local actual = {ai, ao, ai + ao}
local xs = tload(tk)
for i, x in ipairs(xs) do
  if (charged[i] or 0) > 0 then
    if x.tat ~= nil and x.ts ~= nil then
      x.T = x.ts
      local d = actual[i] - charged[i]
      if d > 0 then
        x.tat = x.tat + d * x.T
        x.R = x.R + d
      elseif d < 0 then
        local t2 = x.tat + d * x.T
        local F = kquery(x, id)
        if F ~= nil and F > t2 then t2 = F end
        if t2 < x.tat then x.tat = t2 end
      end
    end
  end
end
tsave(tk, xs)
tkeep(tk, gk, now, tonumber(ARGV[5]), xs)
return {1, charged[1] or 0, charged[2] or 0, charged[3] or 0}
`)

// currentTokensScript reports the token limits in force.
//
// KEYS[1] token hash.
// ARGV[1] now µs, or ""
// ARGV[2] learn TTL µs (also how long a configured capacity counts as in force after its use)
// ARGV[3] token minute µs
// Returns, for the input, output and combined buckets, "capacity rate source" (rate in tokens/s,
// without margins), comma separated.
var currentTokensScript = redis.NewScript(luaCommon + luaTokens + `
local now = clock(ARGV[1])
local learnttl, tmin = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i, x in ipairs(tload(KEYS[1])) do
  local C, rate, src = 0, 0, 'unknown'
  if x.cupd ~= nil and now - x.cupd <= learnttl and x.cr ~= nil then
    C, rate, src = x.cr, x.cr * 1000000 / tmin, 'configured'
  elseif x.L ~= nil and x.lupd ~= nil and now - x.lupd <= learnttl then
    C, src = x.L, 'learned'
    rate = math.max(x.lo or 0, x.L * 1000000 / tmin)
  end
  out[i] = fmt(C) .. ' ' .. fmt(rate) .. ' ' .. src
end
return table.concat(out, ',')
`)
