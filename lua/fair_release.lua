-- Fair lock release, and a waiter's withdrawal. If the lock holds our token it is released:
-- deleted, or, when a live waiter heads the queue, granted to it at once: the key is set to
-- the waiter's token with a short lease (the grant lease, which the waiter's client extends),
-- the waiter leaves the queue, the fencing counter is incremented, and the grant is published
-- as 'dlock-grant:<token>:<fence>:<seconds>:<microseconds>' (the server's TIME when granted:
-- a waiter ignores a grant older than its latest attempt, see fair_acquire.lua). If the lock
-- is not ours, only our queue entry (if any) is removed: a waiter giving up.
-- A holder has no queue entry: a grant and every acquire that finds the lock ours remove it.
-- KEYS[1] lock key
-- KEYS[2] queue: a sorted set, waiter token -> arrival (server time in microseconds)
-- KEYS[3] deadlines: a sorted set, waiter token -> when its entry lapses (server ms)
-- KEYS[4] (optional) fencing counter
-- ARGV[1] our token
-- ARGV[2] the lease of a grant, in milliseconds
-- ARGV[3] the prefix of the channel a grant is published on: the channel is this prefix and
--         the first 16 characters of the granted waiter's token (its client's id)
-- Returns 0 when the lock was not ours (only our queue entry was removed); 1 when released
-- and nobody live waited (the key is deleted); {1, receivers, granted token, fence, seconds,
-- microseconds} when released and granted: receivers = subscriber connections the grant was
-- published to; fence 0 without KEYS[4]; the server's TIME of the grant. (Plain integers where
-- nothing was granted: a table reply cost Redis about 2 µs more per call, INFO commandstats.)
-- Calls: not ours GET ZREM ZREM; nobody queued GET ZPOPMIN DEL; granted GET, the walk's
-- ZPOPMIN TIME ZSCORE ZREM (lua/fair_live_head.lua), [INCR] SET PUBLISH.
-- Bounded: at most 1,100 lapsed entries are dropped (live_head); when more head the queue the
-- lock is left free and the waiters' polls go on (fair_acquire.lua).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    redis.call('zrem', KEYS[2], ARGV[1])
    redis.call('zrem', KEYS[3], ARGV[1])
    return 0
end
-- Nobody queued (the uncontended release): done before the functions below are defined.
local first = redis.call('zpopmin', KEYS[2])[1]
if not first then
    redis.call('del', KEYS[1])
    return 1
end
-- The server's TIME, read only when somebody is queued (by live_head's clock()).
local t, now
local function clock()
    if not t then
        t = redis.call('time')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
end
-- #include fair_live_head.lua
local head = live_head(first)
if head then
    local f = 0
    if #KEYS > 3 then
        f = redis.call('incr', KEYS[4])
    end
    -- Overwrites our token: the hold passes without a moment in which the key is free.
    redis.call('set', KEYS[1], head, 'px', ARGV[2])
    local n = redis.call('publish', ARGV[3] .. string.sub(head, 1, 16),
        'dlock-grant:' .. head .. ':' .. f .. ':' .. t[1] .. ':' .. t[2])
    return {1, n, head, f, tonumber(t[1]), tonumber(t[2])}
end
redis.call('del', KEYS[1])
return 1
