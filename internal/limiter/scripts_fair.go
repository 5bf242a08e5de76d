package limiter

// luaFair is the fair queueing of a credential's slots between lanes (a tenant × a priority),
// run inside reserveScript when an attempt names its Lane (ARGV[28] = "1") and the request rate is
// known (an unknown limit goes one probe at a time, with no queue to order). See fair.go for the
// model; in short: every waiting attempt holds a ticket in its lane (a sorted set ordered by the
// job's creation time, so that a ticket lost with Redis is put back in the same place), each
// lane has a virtual finish time F, and the n-th ticket of lane L is due at virtual time
// F_L + n/w_L (weighted fair queueing, w_L the lane's weight). An ask is granted a slot only when
// fewer tickets are due before its own than there are free slots within the horizon; otherwise
// it is told to come back about when its turn will be, and nothing is reserved. A grant moves its
// lane's F on by its request's dominant share (funits) over the lane's weight: one request slot,
// or more when the request's tokens take longer of a limited token bucket than a slot takes of
// the request bucket, so that a lane's large prompts consume its share.
//
// KEYS[6] fair hash: v (virtual time while no lane waits), F|<lane> (a waiting lane's virtual
// finish time), w|<tenant> (the tenant's weight, as its last attempt said; kept while one of its
// lanes waits), b (the token block: "<tag> <ask again µs> <lane>\n<ticket>", the ask in its turn
// that the token buckets refused last; see fblock)
// KEYS[7] the set of waiting lanes
// KEYS[8] ticket deadlines (sorted set of "<lane>\n<ticket>" by µs): a ticket whose holder has
// not asked again by then is dropped (its job asks again later, and finds its place again)
// KEYS[9] the asking lane's tickets (sorted set: ticket → its order, µs); the other lanes' keys
// are ARGV[29] .. lane, in the same hash tag (so in the same Redis Cluster slot)
// ARGV[28] "1"
// ARGV[29] lane key prefix
// ARGV[30] lane ("<tenant>|<priority>"), ARGV[31] tenant, ARGV[32] priority 0 (high) .. 2 (low)
// ARGV[33] the tenant's weight
// ARGV[34] ticket, ARGV[35] its order (µs)
// ARGV[36..37] minimum share of normal and low (fractions of the tenant's slots)
// ARGV[38] horizon µs, ARGV[39] ticket grace µs, ARGV[40] longest wait before asking again µs
const luaFair = `
local FQ = nil
if ARGV[28] == '1' then
  FQ = {h = KEYS[6], act = KEYS[7], dl = KEYS[8], own = KEYS[9], pre = ARGV[29], lane = ARGV[30],
    tenant = ARGV[31], prio = tonumber(ARGV[32]), tw = tonumber(ARGV[33]), ticket = ARGV[34],
    order = tonumber(ARGV[35]), ms = {tonumber(ARGV[36]), tonumber(ARGV[37])}, hz = tonumber(ARGV[38]),
    grace = tonumber(ARGV[39]), maxwait = tonumber(ARGV[40])}
end

-- fkeep makes the fairness keys outlive every ticket in them.
local function fkeep()
  local ms = math.ceil((2 * (FQ.maxwait + FQ.grace)) / 1000) + 60000
  for _, k in ipairs({FQ.h, FQ.act, FQ.dl, FQ.own}) do redis.call('PEXPIRE', k, ms) end
end

-- fdebt remembers the virtual finish time F of lane ln, which has just stopped waiting, in the
-- debts set (the fair hash's name and 'b': a sorted set of lanes by F), so that the lane, should
-- it wait again before the others' virtual time has passed F, starts at F and not at theirs: a
-- lane emptied by each grant (a tenant with one job at a time) would otherwise come back free of
-- what its last request took, and its large prompts would take the token bucket from the
-- backlogs beside it. The set expires as the fairness keys do; fenter drops the debts paid.
local function fdebt(ln, F)
  if F == nil then return end
  local k = FQ.h .. 'b'
  redis.call('ZADD', k, fmt(F), ln)
  redis.call('PEXPIRE', k, math.ceil((2 * (FQ.maxwait + FQ.grace)) / 1000) + 60000)
end

-- fleave drops the weight of the tenant of lane ln, which has just stopped waiting, unless another
-- of its lanes still waits: a weight is kept only while its tenant waits (each ask sets its own
-- again), so that the hash does not keep a field for every tenant that ever waited.
local function fleave(ln)
  local tenant = string.sub(ln, 1, string.find(ln, '|', 1, true) - 1)
  for p = 0, 2 do
    if redis.call('SISMEMBER', FQ.act, tenant .. '|' .. p) == 1 then return end
  end
  redis.call('HDEL', FQ.h, 'w|' .. tenant)
end

-- fblockread parses the token block b (the fair hash's 'b', or nil; see fblock) into FQ.block:
-- its tag, when its holder was told to ask again, its lane and ticket; FQ.blocker says whether
-- this ask is its holder's.
local function fblockread(b)
  FQ.block, FQ.blocker = nil, false
  if b == nil then return end
  local i = string.find(b, ' ', 1, true)
  local j = string.find(b, ' ', i + 1, true)
  local k = string.find(b, '\n', j + 1, true)
  FQ.block = {tag = tonumber(string.sub(b, 1, i - 1)), again = tonumber(string.sub(b, i + 1, j - 1)),
    lane = string.sub(b, j + 1, k - 1), ticket = string.sub(b, k + 1)}
  FQ.blocker = FQ.block.lane == FQ.lane and FQ.block.ticket == FQ.ticket
end

-- fenter drops expired tickets (the whole lane when its first ticket expires), registers the
-- asking ticket (in its lane, by its order: a ticket already there keeps its place), and computes
-- its rank: how many waiting tickets are due (in virtual time) before it.
local function fenter(now)
  local old = redis.call('ZRANGEBYSCORE', FQ.dl, '-inf', now, 'LIMIT', 0, 100)
  for _, m in ipairs(old) do
    local i = string.find(m, '\n', 1, true)
    if i then
      -- A lane whose first ticket's holder did not come back (a canceled job, a deadline passed, a
      -- worker gone) likely holds more such tickets, each ranked before the other lanes' asks
      -- until its own deadline (up to MaxRecheck + TicketGrace): the whole lane is dropped. Its
      -- live holders put their tickets back, in their order, when they ask.
      local lk, t = FQ.pre .. string.sub(m, 1, i - 1), string.sub(m, i + 1)
      if redis.call('ZRANK', lk, t) == 0 then redis.call('DEL', lk) else redis.call('ZREM', lk, t) end
    end
    redis.call('ZREM', FQ.dl, m)
  end
  redis.call('ZADD', FQ.own, 'NX', FQ.order, FQ.ticket)
  redis.call('ZADD', FQ.dl, now + FQ.grace + 1000000, FQ.lane .. '\n' .. FQ.ticket)
  redis.call('HSET', FQ.h, 'w|' .. FQ.tenant, FQ.tw)
  local hv = redis.call('HMGET', FQ.h, 'v', 'b')
  local v = num(hv[1]) or 0
  fblockread(hv[2] or nil)
  -- the waiting lanes; a lane left empty (its tickets granted or expired) stops waiting
  local lanes, minF, mine = {}, nil, nil
  for _, ln in ipairs(redis.call('SMEMBERS', FQ.act)) do
    local n = redis.call('ZCARD', FQ.pre .. ln)
    local F = num(redis.call('HGET', FQ.h, 'F|' .. ln))
    if n == 0 then
      redis.call('SREM', FQ.act, ln)
      redis.call('HDEL', FQ.h, 'F|' .. ln)
      -- the asking tenant's weight, set above, is about to be used
      if string.sub(ln, 1, #FQ.tenant + 1) ~= FQ.tenant .. '|' then fleave(ln) end
      fdebt(ln, F)
      if F ~= nil and F > v then v = F end
    else
      local bar = string.find(ln, '|', 1, true)
      local x = {name = ln, n = n, F = F, tenant = string.sub(ln, 1, bar - 1),
        prio = tonumber(string.sub(ln, bar + 1))}
      lanes[#lanes + 1] = x
      if ln == FQ.lane then mine = x end
      if F ~= nil and (minF == nil or F < minF) then minF = F end
    end
  end
  redis.call('HSET', FQ.h, 'v', fmt(v))
  -- a lane that starts waiting starts at the virtual time of the others (no credit for idling)
  local V = minF or v
  for _, x in ipairs(lanes) do
    if x.F == nil then
      x.F = V
      redis.call('HSET', FQ.h, 'F|' .. x.name, fmt(V))
    end
  end
  if mine == nil then
    -- a lane that waited lately starts no earlier than where it left (fdebt); debts the others'
    -- virtual time has passed are dropped
    local start, debts = V, FQ.h .. 'b'
    local d = num(redis.call('ZSCORE', debts, FQ.lane))
    if d ~= nil then
      if d > start then start = d end
      redis.call('ZREM', debts, FQ.lane)
    end
    redis.call('ZREMRANGEBYSCORE', debts, '-inf', fmt(V))
    mine = {name = FQ.lane, n = redis.call('ZCARD', FQ.own), F = start, tenant = FQ.tenant, prio = FQ.prio}
    lanes[#lanes + 1] = mine
    redis.call('SADD', FQ.act, FQ.lane)
    redis.call('HSET', FQ.h, 'F|' .. FQ.lane, fmt(start))
  end
  -- weights: a tenant's weight, split between its waiting priorities: each lower one keeps its
  -- minimum share, the highest gets the rest
  local top, lower = {}, {}
  for _, x in ipairs(lanes) do
    if top[x.tenant] == nil or x.prio < top[x.tenant] then top[x.tenant] = x.prio end
  end
  for _, x in ipairs(lanes) do
    if x.prio ~= top[x.tenant] then lower[x.tenant] = (lower[x.tenant] or 0) + FQ.ms[x.prio] end
  end
  for _, x in ipairs(lanes) do
    local tw = num(redis.call('HGET', FQ.h, 'w|' .. x.tenant)) or 1
    if x.prio == top[x.tenant] then x.w = tw * (1 - (lower[x.tenant] or 0)) else x.w = tw * FQ.ms[x.prio] end
  end
  -- rank: tickets due before ours. Ties go to the lane with fewer tickets waiting (a lane that
  -- has just started waiting, an interactive job's, goes before a backlog due at the same
  -- virtual time: it has used none of its share), then to the lane whose name sorts first.
  local pos = redis.call('ZRANK', FQ.own, FQ.ticket) + 1
  FQ.pos = pos
  local tag = mine.F + pos / mine.w
  FQ.tag = tag
  local rank = pos - 1
  for _, x in ipairs(lanes) do
    if x ~= mine then
      local d = (tag - x.F) * x.w
      local c
      if x.n < mine.n or (x.n == mine.n and x.name < mine.name) then
        c = math.floor(d + 1e-9)
      else
        c = math.ceil(d - 1e-9) - 1
      end
      if c > x.n then c = x.n end
      if c > 0 then rank = rank + c end
    end
  end
  FQ.rank, FQ.mine = rank, mine
  fkeep()
end

-- fblocked says whether the ask, whose turn has come, must leave the token buckets to an earlier
-- turn that they refused (fblock): the tokens refilled while that ask waits for enough of them
-- would otherwise go to the asks after it, each needing fewer, and a lane of large prompts
-- would wait as long as another's small ones kept coming. Only an ask that charges a token
-- bucket (tcharge) is held, and only while the blocking ticket still waits in its lane (not yet
-- granted, not dropped), and its holder is not more than a second late to ask again (a wait of
-- at most a second is waited in process: a holder that late is gone, its job canceled or past
-- its deadline, its worker stopped; its ticket stays until its deadline, TicketGrace later, but
-- the tokens are not kept for it meanwhile). Returns nil, or when to ask again (when the
-- blocking ask does).
local function fblocked(now, tcharge)
  local b = FQ.block
  if b == nil or FQ.blocker then return nil end
  if not tcharge or FQ.tag < b.tag then return nil end
  if now > b.again + 1000000 or not redis.call('ZSCORE', FQ.pre .. b.lane, b.ticket) then
    redis.call('HDEL', FQ.h, 'b')
    return nil
  end
  return b.again
end

-- fblock records that the token buckets refused this ask, whose turn had come, until again: the
-- asks of later turns that charge tokens wait for it (fblocked). An ask of an earlier turn
-- refused in turn takes its place.
local function fblock(again)
  if FQ == nil or FQ.mine == nil or FQ.tag == nil then return end
  redis.call('HSET', FQ.h, 'b', fmt(FQ.tag) .. ' ' .. fmt(again) .. ' ' .. FQ.lane .. '\n' .. FQ.ticket)
end

-- ffree counts the free slots of the request bucket whose send time lies within the horizon
-- (slot k may go at base + (k+1-burst)T, plus the phase margin when it waits for a refill).
-- fadmit decides whether the ask may take a slot now: the free slots must outnumber the tickets
-- due before it. Returns true, or false and when to ask again: about when its turn comes, half a
-- horizon (and a tenth of the wait) early, and at half the wait when that is beyond maxwait; under
-- a learned limit at least once a second, as the learned schedule asks (the rate estimate rises,
-- and the provider's surplus is lent only to those who ask).
local function ffree(now, base, T, burst, phase)
  local k1 = math.floor((now - base) / T + burst - 1)
  local k2 = math.floor((now + FQ.hz - phase - base) / T + burst - 1)
  return math.max(k1, k2) + 1
end

local function fadmit(now, base, T, burst, phase, poll, learned, tcharge)
  FQ.T = T
  if FQ.rank < ffree(now, base, T, burst, phase) then
    local b = fblocked(now, tcharge)
    if b == nil then return true end
    -- the tokens are kept for an earlier turn: ask again when its holder does
    if b < now + poll then b = now + poll end
    redis.call('ZADD', FQ.dl, b + FQ.grace, FQ.lane .. '\n' .. FQ.ticket)
    return false, b
  end
  local again = base + (FQ.rank + 1 - burst) * T + phase - FQ.hz / 2
  -- a turn more than a second off is asked for a tenth early (at most a second): a waiter that
  -- comes back through its scheduler (asynq keeps whole seconds; a loaded worker is slow) is then
  -- still in time, and waits out the rest in process
  if again - now > 1000000 then again = again - math.min(1000000, (again - now) / 10) end
  local maxwait = FQ.maxwait
  if learned and maxwait > 1000000 then maxwait = 1000000 end
  -- the ticket is kept until it is due to ask again, at most maxwait (plus the grace): a ticket
  -- whose holder went away blocks nobody for longer
  local keep = again
  if again > now + maxwait then
    -- a turn further off asks again at half its wait (a learned limit: after maxwait), so that a
    -- backlog of N asks about N log N times, spread by place in line, not N every maxwait; its
    -- ticket is dropped meanwhile and takes its place again (by its order) when it asks
    keep = now + maxwait
    if learned then again = keep else again = now + (again - now) / 2 end
  end
  if again < now + poll then again = now + poll end
  if keep < again and keep < now + maxwait then keep = again end
  -- The lane's first ticket is kept until its holder comes back: were the lane left empty
  -- meanwhile, it would start again at the others' virtual time, its place lost at every return
  -- (a light tenant's lone job, or a low job's minimum share, starved behind a backlog).
  if FQ.pos == 1 and keep < again then keep = again end
  redis.call('ZADD', FQ.dl, keep + FQ.grace, FQ.lane .. '\n' .. FQ.ticket)
  -- the holder of the token block, its turn moved off, lets it go (it blocks again, should the
  -- tokens refuse it when its turn comes): the asks held for it were told to come back when it
  -- would, and a block it no longer renews would hold them until it is more than a second late
  if FQ.blocker then redis.call('HDEL', FQ.h, 'b') end
  return false, again
end

-- fquick is the path of an ask while no lane waits, as when one tenant's work goes through a
-- credential it has to itself: with no other ticket its rank is 0, and when a slot is free within
-- the horizon fadmit would grant it. It is then granted without entering its lane: entering and
-- leaving at once would only move the idle virtual time v on, whose value never matters (a lane
-- that starts waiting alone starts there, every later one at the waiting lanes' least F). That
-- saves the ask about twenty Redis commands. Returns true when the ask takes this path; should
-- the grant then be refused after all (a token bucket, the anchor), fquickrefused registers the
-- ticket as fenter would have.
local function fquick(now, base, T, burst, phase)
  if redis.call('SCARD', FQ.act) ~= 0 or ffree(now, base, T, burst, phase) < 1 then return false end
  FQ.quick = true
  return true
end

local function fquickrefused(now)
  if FQ ~= nil and FQ.quick then
    FQ.quick = nil
    fenter(now)
  end
end

-- funits is what the granted request uses of the credential, in request slots (dominant
-- resource): 1, or the time its tokens take of a limited token bucket (cost × µs per token) over
-- the time a request takes of the request bucket (FQ.T), when that is longer. tk is the token
-- work (the script's TK); without it, or before the request rate is known, 1.
local function funits(tk)
  local u = 1
  if tk == nil or FQ.T == nil or FQ.T <= 0 then return u end
  for _, x in ipairs(tk.xs) do
    if x.C ~= nil and x.C > 0 and x.T ~= nil and x.n ~= nil and x.n > 0 then
      local v = x.n * x.T / FQ.T
      if v > u then u = v end
    end
  end
  return u
end

-- fgranted takes the granted ticket out of its lane: the lane has used its request's units
-- (funits) of its share. tk is the script's token work (TK), nil without.
local function fgranted(tk)
  if FQ.blocker then redis.call('HDEL', FQ.h, 'b') end
  redis.call('ZREM', FQ.own, FQ.ticket)
  redis.call('ZREM', FQ.dl, FQ.lane .. '\n' .. FQ.ticket)
  local F = FQ.mine.F + funits(tk) / FQ.mine.w
  if redis.call('ZCARD', FQ.own) == 0 then
    redis.call('SREM', FQ.act, FQ.lane)
    redis.call('HDEL', FQ.h, 'F|' .. FQ.lane)
    fleave(FQ.lane)
    fdebt(FQ.lane, F)
    local v = num(redis.call('HGET', FQ.h, 'v')) or 0
    if F > v then redis.call('HSET', FQ.h, 'v', fmt(F)) end
  else
    redis.call('HSET', FQ.h, 'F|' .. FQ.lane, fmt(F))
  end
end
`
