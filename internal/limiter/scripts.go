package limiter

import (
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// Rates inside the scripts are requests per second, written with %.17g; times are µs (see
// redisscript).

// luaCommon is prepended to every script: the shared prelude, then the limiter's own helpers.
const luaCommon = redisscript.Prelude + `
-- estimate is the learned rate to pace at (0: unknown): the lower bound lo, which the evidence
-- guarantees, under the ceiling cap that a recent 429 set (cap/capt: rate and until when, µs).
-- Pacing below the provider's true rate costs little: what it then accumulates shows in its
-- Remaining and is lent out (see reserveScript).
local function estimate(lo, cap, capt, now)
  if lo == nil or lo <= 0 then return 0 end
  if cap ~= nil and capt ~= nil and capt > now and cap < lo then return cap end
  return lo
end
`

// reserveScript hands out one send time.
//
// KEYS[1] rate hash. Schedule fields: tat (GCRA theoretical arrival time, µs), ts (µs per request
// tat is expressed in), bs (burst tat is expressed in), full (last time the bucket was known
// full, or synced to what the provider reported, µs), nb (not before: Retry-After pushback, µs),
// seq (grants so far), wn (ungranted asks since the last grant), c1t/c1s and c2t/c2s
// (checkpoints: a send time and the grants before it, at least a phase margin apart), pr/pt
// (probe held until / probe start, µs), bg (last grant lent while the rate was unknown, µs),
// cr/cb/cupd (last configured limit seen, and when). Learned fields (L, lo, lupd, av, avs,
// nohdr, cap, capt): see observeScript.
// ARGV[1] now µs, or "" for Redis TIME; then a space and the call's id (redisscript.CallIDs): a
// granted probe's reply is kept redisscript.CallKeep under KEYS[1]..':call:'..id (see keys.go),
// and a call that finds it returns it again. Only a probe's, and the last slot lent while the
// rate is unknown (which holds the others back as a probe does): a probe nobody observes holds
// every other caller back for ProbeTTL, while a slot granted twice wastes one of the provider's,
// rarely (a reply lost with its connection), against a key written for every job
// ARGV[2] configured rate (requests/s; 0 = not configured: use what was learned)
// ARGV[3] configured burst
// ARGV[4] phase margin µs
// ARGV[5] rate margin (fraction)
// ARGV[6] learn TTL µs
// ARGV[7] probe TTL µs
// ARGV[8] poll interval µs
// ARGV[9] learn horizon µs
// Token buckets (ReserveCost only; a plain Reserve passes neither KEYS[2..3] nor ARGV[10..], and
// the script then never touches them):
// KEYS[2] token hash (see luaTokens), KEYS[3] grants hash (see reconcileScript)
// ARGV[10] "1"
// ARGV[11..13] configured capacity of the input, output and combined buckets (tokens per token
// minute; 0 = not configured: use what was learned, if anything)
// ARGV[14..16] this request's cost in each: input tokens, output tokens, both
// ARGV[17] token minute µs (a bucket of N refills N per token minute)
// ARGV[18] token horizon µs (0 = none)
// ARGV[19] grant records kept
// ARGV[20..21] the least the input and the combined cost can be (a cost above a bucket whose
// least fits is cut to the whole bucket)
// The attempt's gate (AttemptOptions; KEYS[2..3] and ARGV[10..21] are then passed, empty when
// there is no token work):
// KEYS[4] pause hash (see pauseScript), KEYS[5] budget hash (see luaBudget)
// ARGV[22] "1": refuse while paused: {-2, since µs, reason, job}, and nothing is reserved; "2":
// that, and also refuse with {-4} when Redis holds no pause state at all, neither the pause hash
// nor its KEYS[4]..':known' (pauseKnownKey; its state lost: AttemptOptions.PauseDurable)
// ARGV[23] "1": a granted slot counts a first attempt in the retry budget
// ARGV[24..27] the budget's window µs, buckets, ratio and floor
// ARGV[41] "1": the caller reports the send of a burst's first slot (AttemptOptions.ReportSend;
// see luaAnchor). ARGV[28..40] are then passed too, empty without a Lane.
// ARGV[42] "1": the credential's circuit breaker must be closed and warm (AttemptOptions.Circuit),
// KEYS[#KEYS] its hash; ARGV[43] its success memory µs (0: no cold-start cap). Anything else
// returns {-3} before the pause check, and nothing is reserved: the caller asks the breaker.
// Returns {granted 0|1, send µs, now µs, probe 0|1, rate (string), burst, source, seq, grant,
// token limits (string), report 0|1 (Reservation.ReportSend), breaker generation (0 without
// ARGV[42])}. When granted is 0 nothing was reserved and send is when to ask again.
// seq is 1 + a number of grants all sent at least a phase margin before this one
// (Observation.Seq). grant is the token grant to Reconcile (0: no token bucket was charged);
// token limits is "capacity rate source" for the input, output and combined buckets, comma
// separated ("" without tokens). A cost larger than a whole bucket returns {-1, bucket name,
// cost, capacity} and changes nothing.
var reserveScript = redisscript.NewScript(luaCommon + luaTokens + luaBudget + luaFair + luaAnchor +
	`
local key = KEYS[1]
-- A call whose reply was lost after it ran (its connection cut) is sent again by the client: a
-- probe it was granted is kept for it (see ARGV[1]), not left out for ProbeTTL. The retry finds
-- the probe out (or the lent slot's hold), so it looks for its kept reply there only: a paced
-- call reads no key more.
local nowarg, callid = string.match(ARGV[1], '^([^ ]*) ?(.*)$')
local callkey = nil
if callid ~= '' then callkey = key .. ':call:' .. callid end
local now = clock(nowarg)
-- The breaker's closed-and-warm test, as its allowScript makes it (a closed breaker that is not
-- cold admits without writing anything): the state, and a Success recorded within the memory.
local BGEN = 0
if ARGV[42] == '1' then
  local h = redis.call('HMGET', KEYS[#KEYS], 'state', 'gen', 'ok')
  local mem, ok = tonumber(ARGV[43]), num(h[3])
  if (h[1] and h[1] ~= 'closed') or (mem > 0 and (ok == nil or now - ok >= mem)) then return {-3} end
  BGEN = num(h[2]) or 0
end
if ARGV[22] == '1' or ARGV[22] == '2' then
  local p = redis.call('HMGET', KEYS[4], 'since', 'reason', 'job')
  if p[1] then return {-2, p[1], p[2] or '', p[3] or ''} end
  if ARGV[22] == '2' and redis.call('EXISTS', KEYS[4], KEYS[4] .. ':known') == 0 then return {-4} end
end
local crate, cburst = tonumber(ARGV[2]), tonumber(ARGV[3])
local phase, rmargin = tonumber(ARGV[4]), tonumber(ARGV[5])
local learnttl, probettl, poll = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local hz = tonumber(ARGV[9])

-- Token buckets: TK is nil for a plain Reserve (no token work at all). THOLD, when set, is when
-- to ask again for a slot the token buckets push (one that waits for their refill): set while
-- the request bucket's burst has not reported its sends (see luaAnchor), since where the
-- provider's token refill stands is not known either until they have left.
local TG, TLIM = 0, ''
local TK = nil
local THOLD = nil
if ARGV[10] ~= nil and ARGV[10] ~= '' then
  local tk, tmin = KEYS[2], tonumber(ARGV[17])
  TK = {xs = {}, tail = num(redis.call('HGET', tk, 'tail')) or 0, thz = tonumber(ARGV[18])}
  local lims = {}
  TK.xs = tload(tk)
  for i, b in ipairs(TB) do
    local x = TK.xs[i]
    local ccap, n = tonumber(ARGV[10 + i]), tonumber(ARGV[13 + i])
    local least = n
    if b ~= 'o' then least = tonumber(ARGV[19 + math.min(i, 2)]) end
    x.n, x.C, x.rate, x.src = n, 0, 0, 'unknown'
    if ccap > 0 then
      x.C, x.rate, x.src = ccap, ccap * 1000000 / tmin, 'configured'
      x.cr, x.cupd = ccap, now
    elseif x.L ~= nil and x.lupd ~= nil and now - x.lupd <= learnttl then
      -- learned: the per-minute limit is a floor on the rate; the headers may prove more
      x.C, x.src = x.L, 'learned'
      x.rate = math.max(x.lo or 0, x.L * 1000000 / tmin)
    end
    if x.C > 0 then
      -- A request larger than the whole bucket can never be sent: say so, change nothing. One
      -- that may fit (its least does) takes the whole bucket.
      if least > x.C then return {-1, TNAME[b], least, x.C} end
      if n > x.C then
        n = x.C
        x.n = n
      end
      x.T = 1000000 / x.rate * (1 + rmargin)
    end
    lims[i] = fmt(x.C) .. ' ' .. fmt(x.rate) .. ' ' .. x.src
  end
  TLIM = table.concat(lims, ',')
end

-- tgate runs the request's token buckets for a request slot at model time m0 (when the request
-- bucket has room) and send time s0 (m0 plus any phase margin). Each bucket b with room for the
-- cost n at a (GCRA on tokens: tat advances n*T per request, burst = capacity) may push both
-- later; a bucket that waits for a refill keeps the phase margin, like the request bucket.
-- Returns true, send, model time (tokens charged, grant recorded) or false, when to ask again
-- (nothing charged): a slot pushed by the tokens beyond the token horizon is refused while
-- another such slot is pending, so that refunds of over-estimated costs apply to the queue.
local function tgate(m0, s0)
  if TK == nil then return true, s0, m0 end
  local tk = KEYS[2]
  local m, s = m0, s0
  local charged = false
  for _, x in ipairs(TK.xs) do
    if x.T ~= nil then
      texpress(x, now)
      if x.tat == nil or x.tat <= now - phase then x.full = now end
      if x.n > 0 then
        charged = true
        local base = x.tat
        if base == nil or base < now then base = now end
        local a = base + (x.n - x.C) * x.T
        if a > m then m = a end
        local sb = now
        if a > (x.full or 0) and a + phase > now then sb = a + phase end
        if sb > s then s = sb end
      end
    end
  end
  local bound = m > m0 or s > s0
  if bound and THOLD ~= nil then
    tsave(tk, TK.xs)
    tkeep(tk, KEYS[3], now, learnttl, TK.xs)
    return false, THOLD
  end
  local thz = TK.thz
  if bound and thz > 0 and s > now + thz and TK.tail > now + thz then
    tsave(tk, TK.xs)
    tkeep(tk, KEYS[3], now, learnttl, TK.xs)
    local again = math.min(s, TK.tail) - thz
    if again > now + 1000000 then again = now + 1000000 end
    if again < now + poll then again = now + poll end
    return false, again
  end
  if charged then
    local id = redis.call('HINCRBY', tk, 'tid', 1)
    local rec = {}
    for i, x in ipairs(TK.xs) do
      rec[i] = 0
      if x.T ~= nil and x.n > 0 then
        kpush(x, id, m, x.R)
        x.R = x.R + x.n
        local b0 = x.tat
        if b0 == nil or b0 < m then b0 = m end
        x.tat = b0 + x.n * x.T
        rec[i] = x.n
      end
    end
    redis.call('HSET', KEYS[3], id, table.concat(rec, ' '))
    redis.call('HDEL', KEYS[3], id - tonumber(ARGV[19]))
    TG = id
    if bound and s > now + thz then redis.call('HSET', tk, 'tail', fmt0(s)) end
  end
  tsave(tk, TK.xs)
  tkeep(tk, KEYS[3], now, learnttl, TK.xs)
  return true, s, m
end

local s = redis.call('HMGET', key, 'tat', 'ts', 'bs', 'full', 'L', 'lo', 'lupd', 'av', 'avs',
  'pr', 'pt', 'nb', 'nohdr', 'bg', 'seq', 'c1t', 'c1s', 'c2t', 'c2s', 'cap', 'capt', 'fa', 'fu', 'tp', 'fl')
local tat, ts, bs, full = num(s[1]), num(s[2]), num(s[3]), num(s[4])
local L, lo, lupd, av, avs = num(s[5]), num(s[6]), num(s[7]), num(s[8]), num(s[9])
local pr, pt, nb, nohdr, bg = num(s[10]), num(s[11]), num(s[12]) or 0, num(s[13]), num(s[14])
local seq, c1t, c1s, c2t, c2s = num(s[15]) or 0, num(s[16]), num(s[17]), num(s[18]), num(s[19])
local cap, capt = num(s[20]), num(s[21])
local fa, fu, tp, fl = num(s[22]), num(s[23]) or 0, num(s[24]), num(s[25])
if lupd == nil or now - lupd > learnttl then L, av = nil, nil end
if nohdr ~= nil and now - nohdr > learnttl then nohdr = nil end
-- lend: requests the provider surely still holds (its reported remaining less our grants since)
local lend = nil
if av ~= nil and avs ~= nil then lend = av - (seq - avs) end

-- KEEPLENT: this grant is the last slot lent while the rate is unknown, which holds the others
-- back for the probe TTL as a probe does (see below): its reply is kept as a probe's.
local KEEPLENT = false
local function reply(granted, send, probe, rate, burst, source, gseq)
  local keep = learnttl
  if tat ~= nil and tat - now + learnttl > keep then keep = tat - now + learnttl end
  if nb - now + learnttl > keep then keep = nb - now + learnttl end
  redis.call('PEXPIRE', key, math.ceil(keep / 1000))
  if granted == 1 and FQ ~= nil and FQ.mine ~= nil then fgranted(TK) end
  if granted == 0 then fquickrefused(now) end
  if granted == 1 and ARGV[23] == '1' then
    budget(KEYS[5], now, 'first', tonumber(ARGV[24]), tonumber(ARGV[25]), tonumber(ARGV[26]),
      tonumber(ARGV[27]))
  end
  local r = {granted, send, now, probe, fmt(rate), burst, source, gseq or 0, TG, TLIM, AREPORT, BGEN}
  if granted == 1 and (probe == 1 or KEEPLENT) and callkey ~= nil then
    redis.call('SET', callkey, cmsgpack.pack(r), 'PX', ` + callKeepMS + `)
  end
  return r
end
-- grant counts one grant sent at snd and returns its Observation.Seq: 1 + the grants sent at
-- least a phase margin earlier, which surely reached the provider first. Later ones may not be
-- reflected in what its response reports.
local function grant(snd)
  local before = seq
  seq = seq + 1
  if c2t == nil or snd - c2t >= phase then
    c1t, c1s, c2t, c2s = c2t, c2s, snd, before
  end
  local g = 0
  if c1t ~= nil and c1t <= snd - phase then g = c1s end
  if c1t ~= nil then redis.call('HSET', key, 'c1t', fmt0(c1t), 'c1s', c1s) end
  redis.call('HSET', key, 'seq', seq, 'c2t', fmt0(c2t), 'c2s', c2s)
  return g + 1
end
-- recheck: when to ask again while an answer is awaited since 'since': half its age, within
-- [poll, 1s], so a long probe does not make every waiter poll fast.
local function recheck(since)
  local w = poll
  if since ~= nil and (now - since) / 2 > w then w = (now - since) / 2 end
  if w > 1000000 then w = 1000000 end
  return now + w
end

local rate, burst, source = 0, 0, 'unknown'
if crate > 0 then
  rate, burst, source = crate, cburst, 'configured'
  redis.call('HSET', key, 'cr', fmt(crate), 'cb', cburst, 'cupd', fmt0(now))
elseif L ~= nil then
  burst, source = L, 'learned'
  rate = estimate(lo, cap, capt, now)
elseif nohdr ~= nil then
  -- the provider sends no rate-limit headers: nothing to pace by but Retry-After
  local ok, snd = tgate(math.max(now, nb), math.max(now, nb))
  if not ok then return reply(0, snd, 0, 0, 0, 'unknown') end
  return reply(1, snd, 0, 0, 0, 'unknown', grant(snd))
end

if rate <= 0 then
  -- Rate unknown. Lend what the provider said remains, else one probe at a time.
  if source == 'learned' and lend ~= nil and lend >= 1 then
    local ok, snd = tgate(math.max(now, nb), math.max(now, nb))
    if not ok then return reply(0, snd, 0, 0, burst, source) end
    redis.call('HSET', key, 'bg', fmt0(now))
    KEEPLENT = lend < 2
    return reply(1, snd, 0, 0, burst, source, grant(snd))
  end
  local since = pt
  if source == 'learned' and bg ~= nil and (since == nil or bg > since) then since = bg end
  if (pr ~= nil and pr > now) or (source == 'learned' and bg ~= nil and now - bg < probettl) then
    if callkey ~= nil then
      -- This call's own first run may be the probe (or the last lent slot): its reply was lost.
      local kept = redis.call('GET', callkey)
      if kept then return cmsgpack.unpack(kept) end
    end
    return reply(0, recheck(since), 0, 0, burst, source)
  end
  local ok, snd = tgate(math.max(now, nb), math.max(now, nb))
  if not ok then return reply(0, snd, 0, 0, burst, source) end
  redis.call('HSET', key, 'pr', fmt0(snd + probettl), 'pt', fmt0(snd))
  return reply(1, snd, 1, 0, burst, source, grant(snd))
end

local T = 1000000 / rate * (1 + rmargin)
if tat == nil then
  if source == 'learned' then
    -- first schedule after learning: start from what the provider said remains
    local tokens = 0
    if lend ~= nil then tokens = math.max(0, math.min(lend, burst)) end
    tat = now + (burst - tokens) * T
    full = now
  end
elseif ts ~= nil and bs ~= nil and (math.abs(ts - T) > 1e-9 * T or bs ~= burst) then
  -- the limit changed: re-express tat in the new one
  if tat > now then
    local e = tat - bs * ts
    if e >= now then
      -- slots are handed out up to e: keep them, continue at the new spacing after e
      tat = e + burst * T
    else
      -- keep the requests the bucket holds now
      local tokens = math.min((now - e) / ts, burst)
      tat = now + (burst - tokens) * T
    end
  end
end
if source == 'learned' and lend ~= nil and lend >= 1 and tat ~= nil and tat > now then
  -- the provider holds more than we model (we pace below its rate): use them now
  local tokens = burst - (tat - now) / T
  if lend > tokens then
    tat = now + (burst - math.min(lend, burst)) * T
    full = now
  end
end
if nb > now then
  -- a 429 said not before nb: the bucket holds one request at nb
  local pb = nb + (burst - 1) * T
  if tat == nil or tat < pb then tat = pb end
end
tat, full, fa, fu, tp = aexpire(key, tat, full, fa, fu, tp, fl, now, T)
local wasfull = tat == nil or tat <= now - phase
if wasfull then
  full = now
  if ARGV[41] == '1' then tat, fa, fu = anew(key, tat, now, fa, fu, T) end
end
local base = tat
if base == nil or base < now then base = now end
local ntat = base + T
local allow = ntat - burst * T
local send = now
-- A request the bucket held when last known full goes at once; one that waits for a refill
-- keeps the phase margin, since the provider's refill may lag ours.
if allow > (full or 0) and allow + phase > now then send = allow + phase end

local granted = 1
local tagain = nil
if FQ ~= nil then
  -- fair queueing: the slot goes to this ask only when its turn is within the horizon (a limit
  -- being learned, or a provider without headers, goes one probe at a time as before: no queue)
  if not fquick(now, base, T, burst, phase) then
    fenter(now)
    -- whether the ask charges a token bucket (see fblocked)
    local tcharge = false
    if TK ~= nil then
      for _, x in ipairs(TK.xs) do
        if x.T ~= nil and x.n > 0 then tcharge = true end
      end
    end
    local ok, again = fadmit(now, base, T, burst, phase, poll, source == 'learned', tcharge)
    if not ok then granted, tagain = 0, again end
  end
end
if granted == 1 and source == 'learned' and send - now > hz then granted = 0 end
if ARGV[41] == '1' and fa ~= nil and fa == full and fu > 0 then
  -- some of the burst has not left yet: where the provider's refill stands is not known, for the
  -- requests (a slot that needs a refill waits here) and for the tokens (tgate holds one the
  -- tokens push)
  THOLD = math.min(now + poll, fl + AW)
  if granted == 1 and allow > full then granted, tagain = 0, THOLD end
end
local tpushed = false
if granted == 1 then
  -- The request bucket has room at max(now, allow); the token buckets may push the slot later,
  -- and the request is then counted at that later time.
  local m0 = math.max(now, allow)
  local ok, s2, m2 = tgate(m0, send)
  if ok then
    if m2 > m0 then ntat = math.max(base, m2) + T end
    tpushed = m2 > m0 or s2 > send
    send = s2
  else
    granted, tagain = 0, s2
    if FQ ~= nil then fblock(s2) end
  end
end
if granted == 1 then tat = ntat end
-- A slot the token buckets push leaves at its send time, not at once: it is no burst slot (its
-- report would hold the asks after it, and its wait would read as the burst's lateness).
if granted == 1 and ARGV[41] == '1' and not tpushed then aheld(key, allow, full, fa, fu, now) end
redis.call('HSET', key, 'tat', fmt0(tat), 'ts', fmt(T), 'bs', burst, 'full', fmt0(full or 0))
if tagain ~= nil then return reply(0, tagain, 0, rate, burst, source) end
if granted == 0 then
  -- Learned limits hand out slots at most a horizon ahead, so that a better estimate, or the
  -- provider's reported remaining, applies to the queue at once. Waiters are spread by their
  -- place in line (wn: refusals since the last grant) to ask again about when their slot is
  -- due, and at least once a second: the provider's surplus is lent only to those who ask.
  local wn = num(redis.call('HGET', key, 'wn')) or 0
  redis.call('HSET', key, 'wn', wn + 1)
  local again = send + wn * T - hz / 2
  if again > now + 1000000 then again = now + 1000000 end
  if again < now + poll then again = now + poll end
  return reply(0, again, 0, rate, burst, source)
end
redis.call('HSET', key, 'wn', 0)
return reply(1, send, 0, rate, burst, source, grant(send))
`)

// observeScript records what a response said.
//
// KEYS[1] rate hash. Learned fields: L (the provider's limit, used as burst), lo/hi (bounds on its
// rate, requests/s; hi absent = unbounded), lupd (last header update, µs; learned state older than
// the learn TTL is ignored), av/avs (the provider surely held av requests when seq was avs),
// cap/capt/capa (ceiling on the rate after a 429, until when and since when, µs), nohdr (last success without
// rate-limit headers, µs), nb (not before, µs) and why: nbat (when the 429 that set it was
// observed, µs), nbra and nbap (the wait it asked for and the wait applied, capped, µs), capid
// (the call that made the cut in force). Deletes pr: the probe has its answer.
// ARGV[1] now µs, or ""; then, after a space, the call's id (redisscript.CallIDs; absent: none):
// go-redis sends a call again when its reply was lost with the connection, and a retry of the
// call that cut the rate (capid) does not cut it again
// ARGV[2] status code
// ARGV[3] headers known 0|1
// ARGV[4] limit
// ARGV[5] remaining
// ARGV[6] dtmax µs: latest the bucket can be full, measured from the send (0 = no reset)
// ARGV[7] dtmin µs: earliest the bucket can be full, measured from the response
// ARGV[8] Retry-After µs from now ("" = none)
// ARGV[9] learn TTL µs
// ARGV[10] decrease: fraction the learned rate drops on a 429 with Retry-After
// ARGV[11] the reservation's seq (0 = unknown)
// ARGV[12] how long a 429's ceiling on the learned rate lasts, µs
// ARGV[13] the Retry-After asked for, µs ("" = none)
// ARGV[14] the Retry-After applied (ARGV[13] capped), µs
// ARGV[15] when the request was sent, µs from now (≤ 0)
// Returns {limit, rate (string)}.
var observeScript = redisscript.NewScript(luaCommon + `
local key = KEYS[1]
local nowarg, callid = string.match(ARGV[1], '^([^ ]*) ?(.*)$')
local now = clock(nowarg)
local status, hdr = tonumber(ARGV[2]), tonumber(ARGV[3])
local newL, rem = tonumber(ARGV[4]), tonumber(ARGV[5])
local dtmax, dtmin = tonumber(ARGV[6]), tonumber(ARGV[7])
local learnttl, dec = tonumber(ARGV[9]), tonumber(ARGV[10])
local oseq = tonumber(ARGV[11])

redis.call('HDEL', key, 'pr')
local s = redis.call('HMGET', key, 'L', 'lo', 'hi', 'lupd', 'av', 'avs', 'nb', 'tat', 'seq', 'cap',
  'capt', 'capa', 'capid')
local L, lo, hi, lupd, av, avs = num(s[1]), num(s[2]), num(s[3]), num(s[4]), num(s[5]), num(s[6])
local nb, tat, seq, cap, capt = num(s[7]) or 0, num(s[8]), num(s[9]) or 0, num(s[10]), num(s[11])
local capa, capid = num(s[12]), s[13]
if lupd == nil or now - lupd > learnttl then
  L, lo, hi, av, avs, cap = nil, nil, nil, nil, nil, nil
  redis.call('HDEL', key, 'cap', 'capt', 'capa', 'capid')
end

if hdr == 1 and newL > 0 then
  if L ~= nil and newL ~= L then
    lo, hi, cap = nil, nil, nil
    redis.call('HDEL', key, 'cap', 'capt', 'capa', 'capid')
  end
  L = newL
  -- What the provider surely holds now: remaining, less every grant that may have reached it
  -- after this request (all of them when the reservation is unknown).
  if oseq < 1 or oseq > seq then oseq = 1 end
  local held = rem - math.max(0, seq - oseq)
  if status ~= 429 and av ~= nil and avs ~= nil and av - (seq - avs) > held then
    held = av - (seq - avs)
  end
  av, avs = held, seq
  if rem < L and dtmax > 0 then
    -- rate = deficit / time to refill it. The deficit is L-rem, less up to one request (remaining
    -- is rounded down); the refill time lies between dtmin and dtmax.
    local d = L - rem
    local loi = math.max(d - 1, d / 2) * 1000000 / dtmax
    local hii = nil
    if dtmin > 0 then hii = d * 1000000 / dtmin end
    if (lo ~= nil and hii ~= nil and hii < lo) or (hi ~= nil and loi > hi) then
      -- inconsistent with what we knew: the provider changed its rate; start over from here
      lo, hi = loi, hii
    else
      if lo == nil or loi > lo then lo = loi end
      if hii ~= nil and (hi == nil or hii < hi) then hi = hii end
    end
  end
  lupd = now
elseif hdr == 0 and status >= 200 and status < 300 then
  redis.call('HSET', key, 'nohdr', fmt0(now))
end

if status == 429 then
  -- we were wrong about what the provider holds: lend nothing until a success says otherwise
  if av ~= nil and av > 0 then av = 0 end
  if ARGV[8] ~= '' then
    local until_ = now + tonumber(ARGV[8])
    if until_ > nb then
      nb = until_
      redis.call('HSET', key, 'nbat', fmt0(now), 'nbra', ARGV[13], 'nbap', ARGV[14])
    end
    -- We were early: take it as evidence the rate is lower than we pace at, as a ceiling that
    -- lasts until the limit changes or ARGV[12] passes. A ceiling rather than a lower lo, which
    -- the next response would raise again when the error is systematic (the provider's clock,
    -- for absolute reset times). A low ceiling costs little: surplus is lent. One cut per
    -- overload: a request sent before the last cut (capa) went out at the rate that cut already
    -- lowered, and a burst of them, refused together, would otherwise compound it once each
    -- (50 of them: 0.5% of the rate). Nor does this call's retry (see ARGV[1]), which runs
    -- after the cut, on Redis's clock as late as the client's retry came.
    local sentBefore = cap ~= nil and capt ~= nil and capt > now and capa ~= nil and
      (now + tonumber(ARGV[15]) < capa or (callid ~= '' and capid == callid))
    if L ~= nil and not sentBefore then
      local est = estimate(lo, cap, capt, now)
      if est > 0 then
        cap, capt = est * (1 - dec), now + tonumber(ARGV[12])
        redis.call('HSET', key, 'cap', fmt(cap), 'capt', fmt0(capt), 'capa', fmt0(now))
        if callid ~= '' then redis.call('HSET', key, 'capid', callid) end
      end
    end
  end
end

redis.call('HSET', key, 'nb', fmt0(nb))
if L ~= nil then
  redis.call('HSET', key, 'L', L, 'lupd', fmt0(lupd))
  if av ~= nil then redis.call('HSET', key, 'av', av, 'avs', avs) end
end
if lo == nil then redis.call('HDEL', key, 'lo') else redis.call('HSET', key, 'lo', fmt(lo)) end
if hi == nil then redis.call('HDEL', key, 'hi') else redis.call('HSET', key, 'hi', fmt(hi)) end

local keep = learnttl
if tat ~= nil and tat - now + learnttl > keep then keep = tat - now + learnttl end
if nb - now + learnttl > keep then keep = nb - now + learnttl end
redis.call('PEXPIRE', key, math.ceil(keep / 1000))

local est = 0
if L ~= nil then est = estimate(lo, cap, capt, now) end
return {L or 0, fmt(est)}
`)

// pushBackScript reports, and with ARGV[2] "1" ends, the push-back of the schedule by a 429's
// Retry-After.
//
// KEYS[1] rate hash (see reserveScript and observeScript: nb, nbat, nbra, nbap; tat, ts, bs).
// ARGV[1] now µs, or ""
// ARGV[2] "1": clear it: nobody waits for nb any more, and a schedule it pushed back (tat beyond
// one request's room from now) starts again from now with the bucket holding one request, as the
// push-back itself would have at nb. Slots already handed out keep their times.
// Returns {nb µs (0: none in force), nbat µs, nbra µs, nbap µs}, as they were before a clear.
var pushBackScript = redisscript.NewScript(luaCommon + `
local key = KEYS[1]
local now = clock(ARGV[1])
local s = redis.call('HMGET', key, 'nb', 'nbat', 'nbra', 'nbap', 'tat', 'ts', 'bs')
local nb = num(s[1]) or 0
if nb <= now then return {0, 0, 0, 0} end
local out = {fmt0(nb), s[2] or '0', s[3] or '0', s[4] or '0'}
if ARGV[2] == '1' then
  redis.call('HDEL', key, 'nb', 'nbat', 'nbra', 'nbap')
  local tat, ts, bs = num(s[5]), num(s[6]), num(s[7])
  if tat ~= nil and ts ~= nil and bs ~= nil then
    local from = now + (bs - 1) * ts
    if tat > from then redis.call('HSET', key, 'tat', fmt0(from)) end
  end
end
return out
`)

// clockScript reads the clock the credential's scripts read (Gate.Now). It names the rate hash,
// without touching it, so that it runs on the server (in a cluster, the node) that holds it.
//
// KEYS[1] rate hash.
// ARGV[1] now µs, or ""
// Returns now µs.
var clockScript = redis.NewScript(luaCommon + `
return clock(ARGV[1])
`)

// clockPauseScript reads the clock the credential's scripts read and its pause state, for a
// delivery of a slot held in a job row (Gate.NowAndPaused): one round trip for what Now and
// Paused read.
//
// KEYS[1] pause hash (see pauseScript), KEYS[2] its known flag.
// ARGV[1] now µs, or ""
// Returns {now µs, since µs or nil (not paused), reason, job, how many of KEYS exist}.
var clockPauseScript = redis.NewScript(luaCommon + `
local s = redis.call('HMGET', KEYS[1], 'since', 'reason', 'job')
return {clock(ARGV[1]), s[1], s[2], s[3], redis.call('EXISTS', KEYS[1], KEYS[2])}
`)

// currentScript reports the limit in force.
//
// KEYS[1] rate hash.
// ARGV[1] now µs, or ""
// ARGV[2] learn TTL µs (also how long a configured limit counts as in force after its last use)
// Returns {source, rate (string), burst}.
var currentScript = redis.NewScript(luaCommon + `
local now = clock(ARGV[1])
local learnttl = tonumber(ARGV[2])
local s = redis.call('HMGET', KEYS[1], 'cr', 'cb', 'cupd', 'L', 'lo', 'lupd', 'cap', 'capt')
local cr, cb, cupd = num(s[1]), num(s[2]), num(s[3])
local L, lo, lupd, cap, capt = num(s[4]), num(s[5]), num(s[6]), num(s[7]), num(s[8])
if cupd ~= nil and now - cupd <= learnttl then
  return {'configured', fmt(cr), cb}
end
if L ~= nil and lupd ~= nil and now - lupd <= learnttl then
  return {'learned', fmt(estimate(lo, cap, capt, now)), L}
end
return {'unknown', '0', 0}
`)

// callKeepMS is redisscript.CallKeep in ms, as the scripts' SET ... PX takes it.
var callKeepMS = strconv.FormatInt(redisscript.CallKeep.Milliseconds(), 10)

// luaBudget is the retry budget's bookkeeping, shared by budgetScript and reserveScript.
//
// budget(key, now, kind, window, n, ratio, floor) works on the budget hash key: fields
// f:<bucket> (first attempts), r:<bucket> (granted retries) and t:<bucket> (granted timeout
// retries), where bucket = floor(now / (window / n)); buckets older than the window are deleted.
// kind "first" counts a first attempt; "retry" and "timeout" ask for one retry of that kind,
// each kind allowed floor + ratio * first attempts within the window. Returns allowed (0|1),
// first attempts in the window and retries of the kind in it (after this call).
const luaBudget = `
local function budget(key, now, kind, window, n, ratio, floor_)
  local width = window / n
  local cur = math.floor(now / width)
  local letter = string.sub(kind, 1, 1)
  local first, used = 0, 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local f = all[i]
    local b = tonumber(string.sub(f, 3))
    if b == nil or b <= cur - n then
      redis.call('HDEL', key, f)
    elseif string.sub(f, 1, 1) == 'f' then
      first = first + tonumber(all[i + 1])
    elseif string.sub(f, 1, 1) == letter then
      used = used + tonumber(all[i + 1])
    end
  end
  local allowed = 1
  if kind == 'first' then
    redis.call('HINCRBY', key, 'f:' .. fmt0(cur), 1)
    first = first + 1
  elseif used + 1 <= floor_ + ratio * first then
    redis.call('HINCRBY', key, letter .. ':' .. fmt0(cur), 1)
    used = used + 1
  else
    allowed = 0
  end
  redis.call('PEXPIRE', key, math.ceil((window + width) / 1000))
  return allowed, first, used
end
`

// budgetScript counts attempts and grants retries within the budget (see luaBudget).
//
// KEYS[1] budget hash
// KEYS[2] optional, with ARGV[7]: the retries refused lately (refusedKey: a sorted set, a
// retry's name → µs of its last refusal; members not refused for a window are dropped). With it,
// the script names two keys more from KEYS[1] (see keys.go): KEYS[1]..':granted', the retries
// granted lately (a sorted set: a retry's name → µs of its grant, for a window), and
// KEYS[1]..':call:'..id, a counted refusal's reply kept for redisscript.CallKeep
// ARGV[1] now µs, or ""; then, with KEYS[2], a space and the call's id (redisscript.CallIDs;
// absent or "": none)
// ARGV[2] "first" (count a first attempt), "retry" or "timeout" (ask for a retry of that kind),
// "look:retry" or "look:timeout" (say whether a retry of that kind would be allowed, counting
// nothing: a look writes no bucket, and deletes none)
// ARGV[3] window µs
// ARGV[4] number of buckets in the window
// ARGV[5] ratio (retries allowed per first attempt)
// ARGV[6] floor (retries allowed per window regardless of first attempts)
// KEYS[3], KEYS[4] optional, with KEYS[2] and ARGV[8..9]: the retry's lane's tickets and the
// ticket deadlines (see luaFair's KEYS[9] and KEYS[8]), from which a refusal takes the retry's
// ticket: a retry the budget refuses waits for it, not in the fair queue
// ARGV[7] optional: the retry's name
// ARGV[8] optional: the lane ("<tenant>|<priority>"), ARGV[9] the retry's ticket
// Returns {allowed 0|1, first attempts in window, retries in window (after this call), 1 when
// the ask was refused and its retry (ARGV[7]) was not refused within the window before, else 0}.
// A look's refusal is a refusal: its retry is kept in KEYS[2] as an ask's is.
//
// A named retry draws once a window: one granted within the window (in the granted set) is
// granted again, counting nothing, and a look at it answers 1. That makes a draw sent again
// after its reply was lost (go-redis sends a call again on a new connection, after Redis may
// have run it) draw once, as it does a delivery that comes back for the same retry before
// sending it; the set holds at most the window's granted retries. A refusal counted (the 1 of
// the reply's last field) keeps its reply under the call's id, which a call sent again returns:
// the refusal is counted by the reply that arrives, not lost with the first.
var budgetScript = redis.NewScript(luaCommon + luaBudget + `
-- look is budget's answer for a retry of kind letter, read without writing.
local function look(key, now, letter, window, n, ratio, floor_)
  local cur = math.floor(now / (window / n))
  local first, used = 0, 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local b = tonumber(string.sub(all[i], 3))
    local l = string.sub(all[i], 1, 1)
    if b ~= nil and b > cur - n and l == 'f' then
      first = first + tonumber(all[i + 1])
    elseif b ~= nil and b > cur - n and l == letter then
      used = used + tonumber(all[i + 1])
    end
  end
  if used + 1 <= floor_ + ratio * first then return 1, first, used end
  return 0, first, used
end

local nowarg, callid = string.match(ARGV[1], '^([^ ]*) ?(.*)$')
local now, window = clock(nowarg), tonumber(ARGV[3])
local n, ratio, floor_ = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local islook = string.sub(ARGV[2], 1, 5) == 'look:'
local callkey, granted = nil, nil
if KEYS[2] ~= nil then
  if callid ~= '' then
    callkey = KEYS[1] .. ':call:' .. callid
    local kept = redis.call('GET', callkey)
    if kept then
      local f, u = string.match(kept, '^(%S+) (%S+)$')
      return {0, tonumber(f), tonumber(u), 1}
    end
  end
  if ARGV[2] ~= 'first' then
    granted = KEYS[1] .. ':granted'
    redis.call('ZREMRANGEBYSCORE', granted, '-inf', now - window)
    if redis.call('ZSCORE', granted, ARGV[7]) then
      local letter = islook and string.sub(ARGV[2], 6, 6) or string.sub(ARGV[2], 1, 1)
      local _, f, u = look(KEYS[1], now, letter, window, n, ratio, floor_)
      return {1, f, u, 0}
    end
  end
end
local allowed, first, used
if islook then
  allowed, first, used = look(KEYS[1], now, string.sub(ARGV[2], 6, 6), window, n, ratio, floor_)
else
  allowed, first, used = budget(KEYS[1], now, ARGV[2], window, n, ratio, floor_)
end
local new = 1 - allowed
if KEYS[2] ~= nil then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
  new = 0
  if allowed == 0 then
    new = redis.call('ZADD', KEYS[2], now, ARGV[7])
    redis.call('PEXPIRE', KEYS[2], math.ceil(window / 1000))
  elseif granted ~= nil and not islook then
    redis.call('ZADD', granted, now, ARGV[7])
    redis.call('PEXPIRE', granted, math.ceil(window / 1000))
  end
  if new == 1 and callkey ~= nil then
    redis.call('SET', callkey, fmt0(first) .. ' ' .. fmt0(used), 'PX', ` + callKeepMS + `)
  end
end
if allowed == 0 and KEYS[3] ~= nil then
  redis.call('ZREM', KEYS[3], ARGV[9])
  redis.call('ZREM', KEYS[4], ARGV[8] .. '\n' .. ARGV[9])
end
return {allowed, first, used, new}
`)

// pauseScript starts a pause episode unless one is running.
//
// KEYS[1] pause hash: since (µs), reason, job (the first job ID), probe (last automatic probe, µs)
// while paused; deleted by a resume (see resumeScript). No TTL: a pause ends only by Resume.
// KEYS[2] its known flag (pauseKnownKey), set here to the episode's since (µs).
// ARGV[1] since µs (now, or an episode kept elsewhere: Gate.PauseSince), or "" for now
// ARGV[2] reason
// ARGV[3] job ID
// ARGV[4..6] optional: the since µs, reason and job ID to start instead when Redis holds the
// credential as not paused after the episode of ARGV[1] (the hash missing beside a known flag
// that names that episode: a resume in Redis alone ended it). A known flag that names another
// (or "1") is a state from before that episode, which Redis lost (a failover's replica had not
// received it): the episode of ARGV[1] goes on, as on no state at all.
// Returns 0 when an episode is running, else 1 when this call started it on no state at all
// (Redis lost it, or never had it), 2 when on a state Redis kept (not paused).
var pauseScript = redis.NewScript(luaCommon + `
if redis.call('HEXISTS', KEYS[1], 'since') == 1 then return 0 end
local known = redis.call('EXISTS', KEYS[1], KEYS[2]) > 0
local since, reason, job = ARGV[1], ARGV[2], ARGV[3]
if known and ARGV[4] ~= nil and ARGV[4] ~= '' then
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    since, reason, job = ARGV[4], ARGV[5], ARGV[6]
  else
    known = false
  end
end
local now = clock(since)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'since', fmt0(now), 'reason', reason, 'job', job)
redis.call('SET', KEYS[2], fmt0(now))
if known then return 2 end
return 1
`)

// resumeScript ends the pause episode, if any: it deletes the pause hash, as the last release's
// Resume did (its Pause starts an episode only when the hash does not exist), and sets the known
// flag, so that Redis says the credential is not paused rather than that it lost the state
// (see restorePauseScript).
//
// KEYS[1] pause hash (see pauseScript), KEYS[2] its known flag.
// Returns 1 when the credential was paused, else 0.
var resumeScript = redis.NewScript(`
local was = redis.call('HEXISTS', KEYS[1], 'since')
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], '1')
return was
`)

// restorePauseScript writes a pause state kept elsewhere (Postgres) back into Redis when Redis
// holds none, neither a pause hash nor its known flag; a state Redis holds (a pause, or a resume
// since) is left as it is.
//
// KEYS[1] pause hash (see pauseScript), KEYS[2] its known flag (the episode's since, as
// pauseScript sets it, or "1" when not paused).
// ARGV[1] since µs ("": not paused, only the known flag is set)
// ARGV[2] reason
// ARGV[3] job ID
// Returns 1 when it wrote the state, else 0.
var restorePauseScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'since', ARGV[1], 'reason', ARGV[2], 'job', ARGV[3])
  redis.call('SET', KEYS[2], ARGV[1])
  return 1
end
redis.call('SET', KEYS[2], '1')
return 1
`)

// restoreLostPauseScript writes back a pause episode kept elsewhere (Postgres) that Redis holds
// as not paused without that episode having ended there: the known flag does not name it (a
// failover's replica had an earlier state, or the pause never reached Redis). An episode that
// reached Redis and was resumed there alone (the flag names it; the last release's resume) stays
// ended, and a pause Redis holds stays.
//
// KEYS[1] pause hash (see pauseScript), KEYS[2] its known flag.
// ARGV[1] since µs, ARGV[2] reason, ARGV[3] job ID: the episode.
// Returns 1 when it wrote the episode, else 0.
var restoreLostPauseScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'since') == 1 then return 0 end
if redis.call('GET', KEYS[2]) == ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'since', ARGV[1], 'reason', ARGV[2], 'job', ARGV[3])
redis.call('SET', KEYS[2], ARGV[1])
return 1
`)

// probeScript grants at most one automatic probe per interval while paused.
//
// KEYS[1] pause hash (see pauseScript).
// ARGV[1] now µs, or ""
// ARGV[2] interval µs
// Returns the probe's grant, the µs it wrote (a string), when the caller may probe, else 0 (also
// when not paused). The first probe comes one interval after the pause began.
var probeScript = redis.NewScript(luaCommon + `
local s = redis.call('HMGET', KEYS[1], 'since', 'probe')
local since, last = num(s[1]), num(s[2])
if since == nil then return 0 end
local now = clock(ARGV[1])
if last == nil then last = since end
if now < last + tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'probe', fmt0(now))
return fmt0(now)
`)

// releaseProbeScript gives back an automatic probe that will not be sent: the pause's next probe
// may go at once, as if this one had not been granted (the last probe counts from the pause's
// start again, which lies at least an interval back, since this probe was granted).
//
// KEYS[1] pause hash (see pauseScript).
// ARGV[1] the probe's grant (what probeScript returned)
// Returns 1 when released, else 0: the hash holds another probe's grant, or none (resumed since).
var releaseProbeScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'probe') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'probe', 'probe_held')
return 1
`)

// holdProbeScript marks an automatic probe as held by a job (its slot is held in the job row, to
// go later): the hash's 'probe_held' field is "<grant> <job ID>".
//
// KEYS[1] pause hash (see pauseScript).
// ARGV[1] the probe's grant (what probeScript returned)
// ARGV[2] job ID
// Returns 1 when marked, else 0: the hash holds another probe's grant, or none (resumed since).
var holdProbeScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'probe') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'probe_held', ARGV[1] .. ' ' .. ARGV[2])
return 1
`)

// reclaimProbeScript hands the pause's probe back to the job holding it (holdProbeScript), once:
// the mark is taken with it.
//
// KEYS[1] pause hash (see pauseScript).
// ARGV[1] job ID
// Returns the probe's grant (a string) when the pause's probe is held by the job, else 0.
var reclaimProbeScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'probe', 'probe_held')
if not s[1] or s[2] ~= s[1] .. ' ' .. ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'probe_held')
return s[1]
`)

// releaseHeldProbeScript gives back the pause's probe held by a job (holdProbeScript) that will
// not send it (its job left the credential, or ended, with the slot held): as releaseProbeScript,
// found by the job instead of the grant.
//
// KEYS[1] pause hash (see pauseScript).
// ARGV[1] job ID
// Returns 1 when released, else 0: the job holds no probe (none held, another's, or resumed since).
var releaseHeldProbeScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 'probe', 'probe_held')
if not s[1] or s[2] ~= s[1] .. ' ' .. ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'probe', 'probe_held')
return 1
`)
