package limiter

import "github.com/llmq/llmq/internal/redisscript"

// luaAnchor sets the schedule after a full bucket by when the burst's requests left, not by
// when they were granted (AttemptOptions.ReportSend).
//
// A full bucket hands out its burst at once, and the slots after it are one refill apart from
// that moment. The provider's bucket, though, stays full (and wastes its refill) until the
// burst's requests reach it, and a worker sends a granted slot only after its own bookkeeping (a
// Postgres write, under a flood of submits as slow as a few hundred ms). When the burst leaves
// later than the first refill slots by more than the phase margin, those slots are 429s. So,
// for a caller that reports its sends, every slot a full bucket holds (a burst; period fa = the
// time the bucket was full, µs) and sends at once is counted (fu: not yet reported; fl: the last
// such grant; a slot the token buckets push later is not: it leaves at its own send time, which
// is no lateness of the burst's, and the asks after it need not wait for it) and
// reported (Reservation.ReportSend = fa; a slot not yet reported when the bucket is full again
// is carried over to the next period); sentScript folds each report into the provider's
// schedule (tp: GCRA over the send times), and once every one is in, the schedule is moved to
// at least that. Until then, slots that need a refill are refused (ask again after the poll
// interval). A report that never comes (the holder died, or its job ended) is taken as a send AW
// after the period's last burst grant. A later schedule only costs time. The token buckets
// follow the same period: a slot they push waits while the burst's sends are unreported (THOLD
// in reserveScript), and when the last report is in, the buckets that were full at its start
// move on by the time from then to that send (fts: how far they were moved in this period).
const luaAnchor = `
local AREPORT = 0
local AW = 1000000

-- aexpire drops a stale period (the bucket was full again since) and takes reports that never
-- came as sends AW after the last burst grant. Returns tat, full, fa, fu, tp.
local function aexpire(key, tat, full, fa, fu, tp, fl, now, T)
  if fa == nil then return tat, full, nil, 0, nil end
  if tat == nil or full == nil or full ~= fa then
    redis.call('HDEL', key, 'fa', 'fu', 'tp', 'fl', 'fts')
    return tat, full, nil, 0, nil
  end
  if fu > 0 and fl ~= nil and now - fl >= AW then
    local p = math.max(tp or 0, fl + AW) + fu * T
    if p > tat then tat = p end
    fu, tp = 0, nil
    redis.call('HSET', key, 'fu', 0)
    redis.call('HDEL', key, 'tp')
  end
  return tat, full, fa, fu, tp
end

-- anew starts a period when the bucket is full (at now): burst slots of the last one not yet
-- reported are still to leave, and take their room in this one (tat), and their reports count
-- here. Returns tat, fa, fu.
local function anew(key, tat, now, fa, fu, T)
  if fa ~= nil and fu > 0 then tat = now + fu * T else fu = 0 end
  redis.call('HSET', key, 'fa', fmt0(now), 'fu', fu)
  redis.call('HDEL', key, 'tp', 'fts')
  return tat, now, fu
end

-- aheld records a granted slot: one the bucket held (sent at once) in the period is counted and
-- is to be reported.
local function aheld(key, allow, full, fa, fu, now)
  if fa == nil or fa ~= full or allow > full then return end
  redis.call('HSET', key, 'fu', fu + 1, 'fl', fmt0(now))
  AREPORT = fa
end
`

// sentScript folds the report of a burst slot's send into the provider's schedule
// (Reservation.ReportSend; see luaAnchor).
//
// KEYS[1] rate hash (fields fa, fu, tp, fl, ts, tat, full: see reserveScript and luaAnchor)
// KEYS[2] token hash (see luaTokens): when the burst's last send is reported, each token bucket
// that was full when the burst began has its schedule moved on by the time from the burst's
// start to that send. Its provider's bucket stayed full (its refill wasted) until the burst's
// requests arrived, so its refill counts from then, not from the grants. Each slot of the burst
// left at most that long after its grant; moving the whole schedule by it is the conservative
// bound, paid once per burst. The refund bounds (b..'k') move with the schedule, so that a grant
// reconciled after the move still gives back what it over-reserved.
// ARGV[1] now µs, or ""; then, after a space, the call's id (redisscript.CallIDs; absent: none)
// ARGV[2] the period the slot was granted in (Reservation.ReportSend); an earlier one counts in
// the current period (carried over)
// A report that counted keeps its reply under KEYS[1]..':call:'..id for redisscript.CallKeep, and
// a call that finds it returns it again, counting nothing: go-redis sends a call again when its
// reply was lost with the connection, and a report counted twice would end the burst a slot early.
// Returns how much later the schedule moved, µs (0: not at all, or not yet).
var sentScript = redisscript.NewScript(luaCommon + luaTokens + `
local key = KEYS[1]
local nowarg, callid = string.match(ARGV[1], '^([^ ]*) ?(.*)$')
local callkey = nil
if callid ~= '' then
  callkey = key .. ':call:' .. callid
  local kept = redis.call('GET', callkey)
  if kept then return tonumber(kept) end
end
local now = clock(nowarg)
local s = redis.call('HMGET', key, 'fa', 'fu', 'tp', 'ts', 'tat', 'full')
local fa, fu, tp, T, tat, full = num(s[1]), num(s[2]) or 0, num(s[3]), num(s[4]), num(s[5]), num(s[6])
-- a report of an earlier period counts here: its slot was carried over (see anew)
if fa == nil or tonumber(ARGV[2]) > fa or full ~= fa or fu <= 0 or T == nil or tat == nil then return 0 end
-- counted keeps the reply of a report that counted, for a retry of its call (see ARGV[1])
local function counted(moved)
  if callkey ~= nil then redis.call('SET', callkey, moved, 'PX', ` + callKeepMS + `) end
  return moved
end
tp = math.max(tp or 0, now) + T
fu = fu - 1
redis.call('HSET', key, 'fu', fu)
if fu > 0 then
  redis.call('HSET', key, 'tp', fmt0(tp))
  return counted(0)
end
redis.call('HDEL', key, 'tp')
-- the period's later bursts (fu back to 0 more than once) move the tokens only by what is new
local done = num(redis.call('HGET', key, 'fts')) or 0
local late = now - fa - done
if late > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', key, 'fts', fmt0(done + late))
  local xs = tload(KEYS[2])
  for _, x in ipairs(xs) do
    if x.tat ~= nil and x.full ~= nil and x.full >= fa then
      -- A shift of the whole schedule, not a slot: the events' model times move with it (see
      -- kquery), so that a refund to a grant before the shift still gives its tokens back.
      local l = kparse(x.k)
      for j = 2, #l, 3 do l[j] = l[j] + late end
      if #l > 0 then x.k = cmsgpack.pack(l) end
      x.tat = x.tat + late
    end
  end
  tsave(KEYS[2], xs)
end
if tp <= tat then return counted(0) end
redis.call('HSET', key, 'tat', fmt0(tp))
return counted(math.floor(tp - tat))
`)
