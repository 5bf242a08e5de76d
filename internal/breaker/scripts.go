package breaker

import "github.com/redis/go-redis/v9"

// Times inside the scripts are integer microseconds since the Unix epoch (exact in a Lua double
// until the year 2255). They are written with %.0f, never tostring, which keeps only 14 digits,
// and returned as integer replies.

// luaCommon is prepended to every script.
const luaCommon = `
local function num(x)
  if x == false or x == nil then return nil end
  return tonumber(x)
end
local function fmt0(x) return string.format('%.0f', x) end
-- clock returns the caller's time (ARGV) or, when it is empty, Redis TIME, so that every process
-- shares one clock.
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  pcall(redis.replicate_commands)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// allowScript admits a request, or says when to ask again.
//
// KEYS[1] breaker hash:
//
//	state  'closed' | 'open' | 'half_open' (no key: closed, no failures, generation 0)
//	gen    generation: bumped by every transition and every probe granted, so that a report
//	       from an admission whose state has ended (a request that was in flight when the
//	       breaker opened, a probe that timed out and was replaced) is recognised and ignored
//	fails  consecutive failures counted while closed
//	since  when the current state began (µs; absent for a closed key never opened)
//	until  open: end of the cooldown; half_open: deadline of the probe out (0: none out) (µs)
//
// ARGV[1] now µs, or "" for Redis TIME
// ARGV[2] probe timeout µs
// ARGV[3] recheck µs: how long callers refused while a probe is out wait before asking again
// ARGV[4] TTL of a half-open key, ms
// Returns {allowed 0/1, probe 0/1, state, retry_at µs (0 when allowed), now µs, gen,
// transitioned 0/1 (this call moved open to half_open)}.
//
// Exactly one probe: the check of the state and the write that makes the caller the probe are
// one script, which Redis runs alone; every other caller sees the probe's deadline.
var allowScript = redis.NewScript(luaCommon + `
local now = clock(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'state', 'gen', 'until')
local state, gen, untl = h[1], num(h[2]) or 0, num(h[3]) or 0
if state == false or state == 'closed' then
  return {1, 0, 'closed', 0, now, gen, 0}
end
local pt = tonumber(ARGV[2])
if state == 'open' then
  if now < untl then return {0, 0, 'open', untl, now, gen, 0} end
  gen = gen + 1
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'gen', fmt0(gen), 'since', fmt0(now),
    'until', fmt0(now + pt))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1, 1, 'half_open', 0, now, gen, 1}
end
-- half_open
if now < untl then
  return {0, 0, 'half_open', math.min(untl, now + tonumber(ARGV[3])), now, gen, 0}
end
-- no probe out (released, or timed out): this caller replaces it
gen = gen + 1
redis.call('HSET', KEYS[1], 'gen', fmt0(gen), 'until', fmt0(now + pt))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, 1, 'half_open', 0, now, gen, 0}
`)

// reportScript records the outcome of an admitted request.
//
// KEYS[1] breaker hash (see allowScript).
// ARGV[1] now µs, or ""
// ARGV[2] generation of the admission
// ARGV[3] outcome: 'success' | 'failure' | 'neutral'
// ARGV[4] threshold: consecutive failures that open a closed breaker
// ARGV[5] cooldown µs
// ARGV[6] TTL of a closed key, ms
// ARGV[7] TTL of an open key, ms
// Returns {state after the report, state transitioned to (” when none)}.
//
// A report whose generation is not the key's is stale and changes nothing. With no key (closed,
// never opened or expired) every report counts as a closed-state report.
var reportScript = redis.NewScript(luaCommon + `
local h = redis.call('HMGET', KEYS[1], 'state', 'gen', 'fails')
local exists = h[1] ~= false
local state, gen, fails = h[1] or 'closed', num(h[2]) or 0, num(h[3]) or 0
if exists and tonumber(ARGV[2]) ~= gen then return {state, ''} end
local o = ARGV[3]
local function open(now)
  redis.call('HSET', KEYS[1], 'state', 'open', 'gen', fmt0(gen + 1), 'since', fmt0(now),
    'until', fmt0(now + tonumber(ARGV[5])), 'fails', '0')
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  return {'open', 'open'}
end
if state == 'closed' then
  if o == 'failure' then
    fails = fails + 1
    if fails >= tonumber(ARGV[4]) then return open(clock(ARGV[1])) end
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen), 'fails', fmt0(fails))
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
  elseif o == 'success' and fails > 0 then
    redis.call('HSET', KEYS[1], 'fails', '0')
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
  end
  return {'closed', ''}
end
if state == 'half_open' then
  -- the generation matched: this is the probe out
  if o == 'failure' then return open(clock(ARGV[1])) end
  if o == 'success' then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'gen', fmt0(gen + 1),
      'since', fmt0(clock(ARGV[1])), 'fails', '0')
    redis.call('HDEL', KEYS[1], 'until')
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
