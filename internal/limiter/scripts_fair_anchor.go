package limiter

import "github.com/redis/go-redis/v9"

// luaAnchor starts the schedule after a full bucket from when the burst's first request left,
// not from its grant (AttemptOptions.ReportSend).
//
// A full bucket hands out its burst at once, and the slots after it are one refill apart from
// that moment. The provider's bucket, though, stays full (and wastes its refill) until the
// first of those requests reaches it, and a worker sends a granted slot only after its own
// bookkeeping (a Postgres write, under a flood of submits as slow as a few hundred ms). When the
// burst leaves later than the first refill slot by more than the phase margin, that slot is a
// 429. So a grant from a full bucket, for a caller that reports its send, is marked (field fa
// of the rate hash: the full bucket's time, µs) and reported (Reservation.ReportSend); until
// sentScript hears that it left, slots that need a refill are refused (ask again after the poll
// interval); when it left, the schedule moves later by how late it left. A report that never
// comes (the holder died or its job ended) is taken as a send AW after the grant. A later
// anchor only costs time: the refill slots then wait longer than they need to.
const luaAnchor = `
local AREPORT = 0
local AW = 1000000

-- aexpire drops a stale mark (another full bucket since) and takes a report that never came as a
-- send AW after the grant. Returns tat, full and the mark (nil: none pending).
local function aexpire(key, tat, full, fa, now)
  if fa == nil then return tat, full, nil end
  if tat == nil or full == nil or full ~= fa then
    redis.call('HDEL', key, 'fa')
    return tat, full, nil
  end
  if now - fa < AW then return tat, full, fa end
  redis.call('HDEL', key, 'fa')
  return tat + AW, fa + AW, nil
end
`

// sentScript reports that the burst's first request (Reservation.ReportSend) is leaving now.
//
// KEYS[1] rate hash (fields fa, full, tat: see reserveScript and luaAnchor)
// ARGV[1] now µs, or ""
// Returns how much later the schedule moved, µs (0: nothing was pending).
var sentScript = redis.NewScript(luaCommon + `
local key = KEYS[1]
local now = clock(ARGV[1])
local s = redis.call('HMGET', key, 'fa', 'full', 'tat')
local fa, full, tat = num(s[1]), num(s[2]), num(s[3])
if fa == nil then return 0 end
redis.call('HDEL', key, 'fa')
if full == nil or tat == nil or full ~= fa or now <= fa then return 0 end
local d = now - fa
redis.call('HSET', key, 'tat', fmt0(tat + d), 'full', fmt0(now))
return math.floor(d)
`)
