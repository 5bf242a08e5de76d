package breaker

import (
	"strconv"

	"github.com/llmq/llmq/internal/redisscript"
)

// Times inside the scripts are µs (see redisscript), returned as integer replies.

// luaCommon is prepended to every script: the shared prelude, then the breaker's own helpers.
const luaCommon = redisscript.Prelude + `
-- cold reports whether a closed breaker is under the cold-start cap: the cap is enabled (mem > 0)
-- and no Success has been recorded (ok) within mem.
local function cold(now, ok, mem)
  return mem > 0 and (ok == nil or now - ok >= mem)
end
`

// allowScript admits a request, or says when to ask again.
//
// KEYS[1] breaker hash:
//
//	state  'closed' | 'open' | 'half_open' (no key: closed, no failures, no success, generation 0)
//	gen    generation: bumped by every transition and every probe granted, so that a report
//	       from an admission whose state has ended (a request that was in flight when the
//	       breaker opened, a probe that timed out and was replaced) is recognised and ignored
//	fails  consecutive failures counted while closed
//	ok     when the last Success was recorded (µs; refreshed at most once per SuccessMemory/16)
//	seq    the last cold-start lease id handed out
//	cd     the cooldown of the current open period (µs; absent while closed): Cooldown when the
//	       breaker opened from closed, times CooldownFactor per failed probe, capped
//	since  when the current state began (µs; absent for a closed key never opened)
//	until  open: end of the cooldown; half_open: deadline of the probe out (0: none out) (µs)
//
// KEYS[2] cold-start leases: a sorted set, member the lease id, score its deadline (µs). Only a
// closed breaker holds leases; every transition out of closed deletes them.
//
// ARGV[1] now µs, or "" for Redis TIME
// ARGV[2] probe timeout µs (also a lease's lifetime)
// ARGV[3] recheck µs: how long refused callers wait before asking again
// ARGV[4] TTL of a half-open key, ms
// ARGV[5] threshold
// ARGV[6] success memory µs (0: no cold-start cap)
// ARGV[7] TTL of a closed key holding leases, ms
// ARGV[8] the call's id (redisscript.CallIDs; "" or absent: none): an admission that wrote (the
// probe, a cold-start lease) keeps its reply under KEYS[1]..':call:'..id for
// redisscript.CallKeep, and a call that finds it returns it again: go-redis sends the call again
// when its reply was lost with the connection, after Redis may have run it, and the retry must
// get the probe (or lease), not find it out for ProbeTimeout. A warm closed breaker's admission
// writes nothing, so it neither looks nor keeps.
// Returns {allowed 0/1, probe 0/1, state, retry_at µs (0 when allowed), now µs, gen,
// transitioned 0/1 (this call moved open to half_open), lease id (0: none), capped 0/1 (refused
// by the cold-start cap)}.
//
// Exactly one probe, and at most threshold − fails cold-start leases: the check of the state and
// the write that admits the caller are one script, which Redis runs alone.
var allowScript = redisscript.NewScript(luaCommon + `
local now = clock(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'state', 'gen', 'until', 'fails', 'ok', 'seq')
local state, gen, untl = h[1], num(h[2]) or 0, num(h[3]) or 0
local warm = (state == false or state == 'closed') and not cold(now, num(h[5]), tonumber(ARGV[6]))
if warm then return {1, 0, 'closed', 0, now, gen, 0, 0, 0} end
-- A call sent again after its reply was lost gets what its first run granted (see ARGV[8]).
local callkey = nil
if ARGV[8] ~= nil and ARGV[8] ~= '' then
  callkey = KEYS[1] .. ':call:' .. ARGV[8]
  local kept = redis.call('GET', callkey)
  if kept then return cmsgpack.unpack(kept) end
end
local function granted(r)
  if callkey ~= nil then
    redis.call('SET', callkey, cmsgpack.pack(r), 'PX', ` + callKeepMS + `)
  end
  return r
end
if state == false or state == 'closed' then
  -- Cold: admit while the requests out plus the failures counted stay under the threshold, so
  -- that opening costs exactly threshold requests however many callers arrive at once. At
  -- least one lease is always possible (a threshold lowered under a stored count).
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt0(now))
  local out = redis.call('ZCARD', KEYS[2])
  local room = math.max(tonumber(ARGV[5]) - (num(h[4]) or 0), 1)
  if out < room then
    local seq = (num(h[6]) or 0) + 1
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen), 'seq', fmt0(seq))
    redis.call('PEXPIRE', KEYS[1], ARGV[7])
    redis.call('ZADD', KEYS[2], fmt0(now + tonumber(ARGV[2])), fmt0(seq))
    redis.call('PEXPIRE', KEYS[2], fmt0(math.ceil(tonumber(ARGV[2]) / 1000)))
    return granted({1, 0, 'closed', 0, now, gen, 0, seq, 0})
  end
  -- full: ask again after the recheck, or when the first lease expires if that is sooner
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local at = math.min(tonumber(first[2]), now + tonumber(ARGV[3]))
  return {0, 0, 'closed', at, now, gen, 0, 0, 1}
end
local pt = tonumber(ARGV[2])
if state == 'open' then
  if now < untl then return {0, 0, 'open', untl, now, gen, 0, 0, 0} end
  gen = gen + 1
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'gen', fmt0(gen), 'since', fmt0(now),
    'until', fmt0(now + pt))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return granted({1, 1, 'half_open', 0, now, gen, 1, 0, 0})
end
-- half_open
if now < untl then
  return {0, 0, 'half_open', math.min(untl, now + tonumber(ARGV[3])), now, gen, 0, 0, 0}
end
-- no probe out (released, or timed out): this caller replaces it
gen = gen + 1
redis.call('HSET', KEYS[1], 'gen', fmt0(gen), 'until', fmt0(now + pt))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return granted({1, 1, 'half_open', 0, now, gen, 0, 0, 0})
`)

// callKeepMS is redisscript.CallKeep in ms, as the scripts' SET ... PX takes it.
var callKeepMS = strconv.FormatInt(redisscript.CallKeep.Milliseconds(), 10)

// reportScript records the outcome of an admitted request.
//
// KEYS[1] breaker hash, KEYS[2] cold-start leases (see allowScript).
// ARGV[1]  now µs, or ""
// ARGV[2]  generation of the admission
// ARGV[3]  outcome: 'success' | 'failure' | 'neutral'
// ARGV[4]  threshold: consecutive failures that open a closed breaker
// ARGV[5]  cooldown µs: the first open period's
// ARGV[6]  TTL of a closed key, ms
// ARGV[7]  TTL of an open key beyond its cooldown, ms
// ARGV[8]  the admission's lease id (0: none)
// ARGV[9]  success memory µs (0: no cold-start cap)
// ARGV[10] success refresh µs: a warm breaker records a Success only when its last is older
// ARGV[11] cooldown factor applied per failed probe
// ARGV[12] max cooldown µs
// ARGV[13] TTL of a closed key holding leases, ms
// ARGV[14] the report's call id (redisscript.CallIDs; "": none): a closed-state failure is counted
// once per id (go-redis sends the report again when its reply was lost with the connection, after
// Redis may have run it). The hash's fids holds the ids of the failures counted since fails was
// last 0 (" id1 id2 "): a report sent again later finds the breaker opened (a new generation: the
// report is stale) or fails reset (a Success came between: the retry counts again, as one).
// Returns {state after the report, state transitioned to (” when none)}.
//
// A report whose generation is not the key's is stale and changes nothing, but for a closed key
// and a later generation: a live key's generation only grows, so that admission was taken before
// the key expired (and started again at 0), in the same closed state, and counts. With no key
// (closed, never opened or expired) every report counts as a closed-state report.
var reportScript = redisscript.NewScript(luaCommon + `
local h = redis.call('HMGET', KEYS[1], 'state', 'gen', 'fails', 'ok', 'cd', 'fids')
local exists = h[1] ~= false
local state, gen, fails = h[1] or 'closed', num(h[2]) or 0, num(h[3]) or 0
local agen = tonumber(ARGV[2])
if exists and agen ~= gen and not (state == 'closed' and agen > gen) then return {state, ''} end
local o = ARGV[3]
local mem = tonumber(ARGV[9])
local function open(now, cd)
  redis.call('HSET', KEYS[1], 'state', 'open', 'gen', fmt0(gen + 1), 'since', fmt0(now),
    'until', fmt0(now + cd), 'fails', '0', 'cd', fmt0(cd))
  redis.call('HDEL', KEYS[1], 'fids')
  redis.call('PEXPIRE', KEYS[1], fmt0(math.ceil(cd / 1000) + tonumber(ARGV[7])))
  redis.call('DEL', KEYS[2])
  return {'open', 'open'}
end
if state == 'closed' then
  if tonumber(ARGV[8]) > 0 then redis.call('ZREM', KEYS[2], ARGV[8]) end
  local ttl = ARGV[6]
  if redis.call('EXISTS', KEYS[2]) == 1 then ttl = ARGV[13] end
  if o == 'failure' then
    local fids = h[6] or ''
    if ARGV[14] ~= '' then
      if fails > 0 and string.find(fids, ' ' .. ARGV[14] .. ' ', 1, true) then
        return {'closed', ''} -- this report sent again: its failure was counted
      end
      if fails == 0 or fids == '' then fids = ' ' end
      fids = fids .. ARGV[14] .. ' '
    end
    fails = fails + 1
    if fails >= tonumber(ARGV[4]) then return open(clock(ARGV[1]), tonumber(ARGV[5])) end
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen), 'fails', fmt0(fails), 'fids', fids)
    redis.call('PEXPIRE', KEYS[1], ttl)
  elseif o == 'success' then
    local now = clock(ARGV[1])
    local ok = num(h[4])
    if cold(now, ok, mem) then
      -- the cap lifts: the leases still out no longer hold anything back
      redis.call('DEL', KEYS[2])
      ttl = ARGV[6]
    end
    local stamp = mem > 0 and (ok == nil or now - ok >= tonumber(ARGV[10]))
    if fails > 0 or stamp then
      redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen), 'fails', '0')
      redis.call('HDEL', KEYS[1], 'fids')
      if stamp then redis.call('HSET', KEYS[1], 'ok', fmt0(now)) end
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
  end
  return {'closed', ''}
end
if state == 'half_open' then
  -- the generation matched: this is the probe out
  if o == 'failure' then
    local cd = num(h[5]) or tonumber(ARGV[5])
    return open(clock(ARGV[1]), math.min(math.floor(cd * tonumber(ARGV[11])), tonumber(ARGV[12])))
  end
  if o == 'success' then
    local now = clock(ARGV[1])
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen + 1),
      'since', fmt0(now), 'fails', '0')
    if mem > 0 then redis.call('HSET', KEYS[1], 'ok', fmt0(now)) end
    redis.call('HDEL', KEYS[1], 'until', 'cd')
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
    return {'closed', 'closed'}
  end
  -- neutral: the probe proved nothing; the next caller probes at once
  redis.call('HSET', KEYS[1], 'gen', fmt0(gen + 1), 'until', '0')
  return {'half_open', ''}
end
-- open: no admission carries an open breaker's generation
return {state, ''}
`)

// statusScript reads a breaker for Status without changing it.
//
// KEYS[1] breaker hash, KEYS[2] cold-start leases (see allowScript).
// ARGV[1] now µs, or ""
// ARGV[2] success memory µs (0: no cold-start cap)
// Returns {state (empty when no key), since µs, until µs, fails, capped 0/1, leases out}.
var statusScript = redisscript.NewScript(luaCommon + `
local now = clock(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'state', 'since', 'until', 'fails', 'ok')
local state = h[1] or ''
if state ~= '' and state ~= 'closed' then
  return {state, num(h[2]) or 0, num(h[3]) or 0, 0, 0, 0}
end
local capped, out = 0, 0
if cold(now, num(h[5]), tonumber(ARGV[2])) then
  capped = 1
  out = redis.call('ZCOUNT', KEYS[2], '(' .. fmt0(now), '+inf')
end
return {state, num(h[2]) or 0, 0, num(h[4]) or 0, capped, out}
`)
