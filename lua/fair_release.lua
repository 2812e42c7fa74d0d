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
-- ARGV[4] (optional, a release only) our successor: the token of the thread of our client that
--         heads its line for this lock. When the lock was ours, it joins the queue here, after
--         the grant (as fair_acquire.lua would queue it, arriving now), or, when no live waiter
--         heads the queue, it is granted the lock itself. Not when the lock was not ours.
-- ARGV[5] with ARGV[4]: how long its queue entry lives without a refresh, in milliseconds
-- Returns 0 when the lock was not ours (only our queue entry was removed); 1 when released
-- and nobody live waited (the key is deleted); {1, receivers, granted token, fence, seconds,
-- microseconds} when released and granted: receivers = subscriber connections the grant was
-- published to; fence 0 without KEYS[4]; the server's TIME of the grant. (Plain integers where
-- nothing was granted: a table reply cost Redis about 2 µs more per call, INFO commandstats.)
-- With ARGV[4], a release that was ours always returns the table, with the server's TIME of
-- the call (granted token '' and receivers 0 when it granted nothing).
-- Calls: not ours GET ZREM ZREM; nobody queued GET ZPOPMIN DEL; granted GET, the walk's
-- ZPOPMIN TIME ZSCORE ZREM (lua/fair_live_head.lua), [INCR] SET PUBLISH; with a successor
-- that is queued, also ZADD ZADD PTTL (and PEXPIRE twice about every ARGV[5] ms).
-- Bounded: at most 1,100 lapsed entries are dropped (live_head); when more head the queue the
-- lock is left free and the waiters' polls go on (fair_acquire.lua).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    redis.call('zrem', KEYS[2], ARGV[1])
    redis.call('zrem', KEYS[3], ARGV[1])
    return 0
end
local succ = ARGV[4]
-- Nobody queued (the uncontended release): done before the functions below are defined.
local first = redis.call('zpopmin', KEYS[2])[1]
if not first and not succ then
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
local head, more = nil, false
if first then
    head, more = live_head(first)
end
if not head and not more then
    -- Nobody live waits: the successor (if any) is next.
    head = succ
end
if head and head == succ then
    succ = nil
end
local n, f = 0, 0
if head then
    clock()
    if #KEYS > 3 then
        f = redis.call('incr', KEYS[4])
    end
    -- Overwrites our token: the hold passes without a moment in which the key is free.
    redis.call('set', KEYS[1], head, 'px', ARGV[2])
    n = redis.call('publish', ARGV[3] .. string.sub(head, 1, 16),
        'dlock-grant:' .. head .. ':' .. f .. ':' .. t[1] .. ':' .. t[2])
else
    redis.call('del', KEYS[1])
end
if succ then
    -- Queued as fair_acquire.lua queues a waiter (NX: one queued already keeps its place).
    clock()
    local ttl = tonumber(ARGV[5])
    redis.call('zadd', KEYS[2], 'NX', t[1] .. string.format('%06d', tonumber(t[2])), succ)
    redis.call('zadd', KEYS[3], now + ttl, succ)
    if redis.call('pttl', KEYS[2]) < ttl then
        redis.call('pexpire', KEYS[2], 2 * ttl)
        redis.call('pexpire', KEYS[3], 2 * ttl)
    end
elseif not head then
    return 1
end
return {1, n, head or '', f, tonumber(t[1]), tonumber(t[2])}
