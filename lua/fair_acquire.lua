-- Fair lock acquire: take the lock if it is free and nobody live waits before us; otherwise
-- (when asked to wait) join the lock's queue, or refresh our place in it. A free lock with a
-- live waiter at the head of the queue is granted to that waiter here (as a release would).
-- KEYS[1] lock key (a string: the holder's token)
-- KEYS[2] queue: a sorted set, waiter token -> arrival (the server's time in microseconds
--         when the waiter joined; two arrivals in one microsecond are ordered by token)
-- KEYS[3] deadlines: a sorted set, waiter token -> when its entry lapses (server ms)
-- KEYS[4] (optional) fencing counter, in the key's slot
-- ARGV[1] our token
-- ARGV[2] our lease in milliseconds
-- ARGV[3] 'w': join or refresh the queue when refused; 't': one try, never queue
-- ARGV[4] how long a queue entry lives without a refresh, in milliseconds
-- ARGV[5] the lease of a grant to a waiter, in milliseconds
-- ARGV[6] the prefix of the channel a grant is published on: the channel is this prefix and
--         the first 16 characters of the granted waiter's token (its client's id)
-- Returns {1, fence} when the lock is ours: just taken, or granted to us earlier (its lease is
-- then set to ARGV[2] and fence is the counter's current value); fence 0 without KEYS[4].
-- Returns {0, rank, seconds, microseconds} when refused: our 0-based place in the queue (-1
-- when not queued) and the server's TIME: a grant published with an earlier time was made
-- before this call (and had lapsed or gone, or this call would have found the lock ours), so
-- a waiter ignores such a grant message if it comes late.
-- A grant is published on ARGV[6] as 'dlock-grant:<token>:<fence>:<seconds>:<microseconds>'
-- (fence 0 without KEYS[4]; the time is the server's TIME when granted).
-- Calls: free, nobody queued GET EXISTS SET [INCR]; held, queued GET TIME ZADD ZADD PTTL
-- ZRANK, and ZRANGEBYSCORE too when it refreshes our entry or finds 16 or more ahead (and
-- PEXPIRE twice about every ARGV[4] ms).
-- Bounded: a call drops at most 1,100 lapsed entries while the lock is free (live_head) and 10
-- while it is held. While more lapsed entries than that head the queue, a free lock is neither
-- taken nor granted by this call (the waiters' next polls go on dropping them).
-- The uncontended case first: a free lock and no queue.
local cur = redis.call('get', KEYS[1])
if not cur and redis.call('exists', KEYS[2]) == 0 then
    redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
    if #KEYS > 3 then
        return {1, redis.call('incr', KEYS[4])}
    end
    return {1, 0}
end
if cur == ARGV[1] then
    -- Granted to us (the grant took us out of the queue).
    redis.call('pexpire', KEYS[1], ARGV[2])
    local f = 0
    if #KEYS > 3 then
        f = tonumber(redis.call('get', KEYS[4]) or '0')
    end
    return {1, f}
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- live_head's clock(): t and now are read above.
local function clock() end
local function fence()
    if #KEYS > 3 then
        return redis.call('incr', KEYS[4])
    end
    return 0
end
-- #include fair_live_head.lua
if not cur then
    local head, more = live_head()
    if head == ARGV[1] or (not head and not more) then
        redis.call('set', KEYS[1], ARGV[1], 'px', ARGV[2])
        return {1, fence()}
    end
    if head then
        local f = fence()
        redis.call('set', KEYS[1], head, 'px', ARGV[5])
        redis.call('publish', ARGV[6] .. string.sub(head, 1, 16),
            'dlock-grant:' .. head .. ':' .. f .. ':' .. t[1] .. ':' .. t[2])
    end
end
if ARGV[3] ~= 'w' then
    return {0, -1, tonumber(t[1]), tonumber(t[2])}
end
-- NX: a waiter already queued keeps its place. The arrival is written as a string of digits
-- (seconds, then six digits of microseconds): exact, where Lua's number formatting is not.
local joined = redis.call('zadd', KEYS[2], 'NX', t[1] .. string.format('%06d', tonumber(t[2])),
    ARGV[1])
redis.call('zadd', KEYS[3], now + tonumber(ARGV[4]), ARGV[1])
-- The sorted sets live at least as long as their longest entry: whenever less than an entry's
-- life is left they are given two.
if redis.call('pttl', KEYS[2]) < tonumber(ARGV[4]) then
    redis.call('pexpire', KEYS[2], 2 * tonumber(ARGV[4]))
    redis.call('pexpire', KEYS[3], 2 * tonumber(ARGV[4]))
end
-- Up to 10 lapsed entries are dropped by a waiter's refresh (not its first call), and by every
-- call that finds 16 or more entries ahead of it, so that waiters dying faster than the
-- refreshes sweep cannot grow the queue without bound while the lock stays held.
local rank = redis.call('zrank', KEYS[2], ARGV[1])
if joined == 0 or rank >= 16 then
    local lapsed = redis.call('zrangebyscore', KEYS[3], '-inf', now - 1, 'limit', 0, 10)
    if #lapsed > 0 then
        redis.call('zrem', KEYS[2], unpack(lapsed))
        redis.call('zrem', KEYS[3], unpack(lapsed))
        rank = redis.call('zrank', KEYS[2], ARGV[1])
    end
end
return {0, rank, tonumber(t[1]), tonumber(t[2])}
