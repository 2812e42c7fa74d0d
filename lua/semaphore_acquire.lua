-- Semaphore: take ARGV[1] permits, all or none, in Redisson's RPermitExpirableSemaphore layout.
-- KEYS[1]   the semaphore's name: the count of free permits (a string integer; absent: never
--           set, nothing to take)
-- KEYS[2]   the permits taken: a sorted set (Redisson's '{name}:timeout', in the name's slot),
--           members the raw 16-byte permit ids, scores their expiry in epoch milliseconds
-- ARGV[1]   how many permits to take (1..1000)
-- ARGV[2]   each permit's lease in milliseconds (>= 1)
-- ARGV[3]   the channel releases are announced on (Redisson's 'redisson_sc:{name}'); a PUBLISH
--           in a script is not routed by slot, so the channel is no KEY
-- ARGV[4..] the new permits' ids, raw 16 bytes each, ARGV[1] of them
-- Clock: the server's (TIME), so that every client of this library scores on one clock.
-- First, as each of Redisson's scripts does, expired permits are reclaimed (removed, added back
-- to the count) and the new count is published if positive: at most 100 + ARGV[1] per call.
-- An acquire whose first id is in the set already ran: it takes nothing more (idempotent per
-- ids, as the release is).
-- Returns {1, free permits left} when taken (or taken by the same ids before), else
-- {0, free permits (-1: never set), wait}: wait = ms until the earliest permit expires by the
-- server's clock, -1 if none does (no permit taken, or only Redisson's permits without a
-- lease).
-- #include semaphore_reclaim.lua
local n = tonumber(ARGV[1])
reclaim(100 + n, ARGV[3])
local value = redis.call('get', KEYS[1])
-- The same acquire sent again (redis-rs resends a command after a timeout on a Cluster, the
-- pool after a dropped connection): its ids are taken already, so nothing more is taken.
if redis.call('zscore', KEYS[2], ARGV[4]) then
    return {1, tonumber(value or '0')}
end
if value ~= false and tonumber(value) >= n then
    local left = redis.call('decrby', KEYS[1], n)
    local score = now + tonumber(ARGV[2])
    local members = {}
    for i = 4, #ARGV do
        members[#members + 1] = score
        members[#members + 1] = ARGV[i]
    end
    redis.call('zadd', KEYS[2], unpack(members))
    -- As Redisson: the permits live as long as the count, if it has an expiry.
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return {1, left}
end
local wait = -1
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if v[1] ~= nil and tonumber(v[2]) < 922337203685477 then
    wait = math.max(0, tonumber(v[2]) - now)
end
return {0, tonumber(value or '-1'), wait}
