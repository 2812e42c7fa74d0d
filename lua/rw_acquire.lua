-- Read-write lock: take one read or write hold, in Redisson's RReadWriteLock layout
-- (docs/rwlock.md): the same tests as RedissonReadLock / RedissonWriteLock.tryLockInnerAsync,
-- plus the library's writer preference, kept in a separate sorted set (KEYS[2]) that
-- Redisson never reads.
-- KEYS[1] lock key (Redisson's hash, or absent)
-- KEYS[2] waiting writers: a sorted set, member = owner id, score = expiry of its intent
--         (server ms); 'dlock_rwlock_writers:{name}' (name's slot)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id '<uuid>:<thread number>' (Redisson's getLockName)
-- ARGV[3] lifetime of the hold in milliseconds (>= 1)
-- ARGV[4] write only: lifetime in milliseconds of the "writer waiting" intent left when the
--         attempt is refused (0 leaves none; a single try_lock passes 0)
-- ARGV[5], ARGV[6] (optional) the owner's read and write hold counts as the calling thread
--         knows them: a larger count of the owner's in that mode is a hold it gave up but the
--         server kept (a release done on a primary that failed over before replicating it),
--         and is set back to this count first (read holds above it lose their timeout keys;
--         a hash left with no hold is deleted, one left without the owner's write is in mode
--         'read'), so that the stale hold does not outlive the owner's next release.
--         Without them the script behaves as before.
-- Returns {code, holds, wait}; holds = the owner's read + write holds afterwards; wait = on a
-- refusal, how long a waiter may sleep if nothing is published (the hash's PTTL, or sooner
-- the expiry of the writer intent that refused a reader; -1 unknown), else 0; and code:
--    1  acquired (a first hold, one more for the same owner, or the writer taking read);
--    0  refused: read: another owner holds write; write: the lock is held by others
--       (the intent, if asked for, is left or refreshed);
--   -1  read refused: a writer of this library waits (its intent lives) and this owner holds
--       nothing; owners already holding read or write may always re-enter;
--   -2  write refused: the owner holds read but not write (no upgrades; nothing is changed);
--   -3  refused: the owner already holds MAX_COUNT holds in that mode.
-- Returns the bulk string '<field>=<value>' when the hash is not a read-write lock's (then
-- nothing is changed). A key of another type fails with WRONGTYPE.
local want, owner = ARGV[1], ARGV[2]
local ttl, intent = tonumber(ARGV[3]), tonumber(ARGV[4])
local known_read, known_write = ARGV[5], ARGV[6]
if (want ~= 'read' and want ~= 'write') or owner == nil or owner == ''
    or ttl == nil or ttl < 1 or intent == nil or intent < 0
    or (known_read ~= nil and not string.match(known_read, '^%d+$'))
    or (known_write ~= nil and not string.match(known_write, '^%d+$')) then
    return redis.error_reply('ERR rw_acquire.lua: bad arguments')
end
known_read, known_write = tonumber(known_read), tonumber(known_write)

-- #include rw_prelude.lua

-- The owner's stale holds (see ARGV[5], ARGV[6]) set back to what its thread holds.
local stale = false
if known_write and wcount > known_write then
    stale = true
    wcount = known_write
    if wcount > 0 then
        redis.call('hset', key, owner .. ':write', wcount)
    else
        redis.call('hdel', key, owner .. ':write')
        if mode == 'write' then
            -- as the write release leaves it: the owner's read holds, if any, are a reader's
            mode = 'read'
            redis.call('hset', key, 'mode', mode)
        end
    end
end
if known_read and rcount > known_read then
    stale = true
    -- our own counts never pass MAX_COUNT, nor do the timeout keys behind them
    for i = known_read + 1, math.min(rcount, MAX_COUNT) do
        redis.call('del', timeout_key(owner, i))
    end
    rcount = known_read
    if rcount > 0 then
        redis.call('hset', key, owner, rcount)
    else
        redis.call('hdel', key, owner)
    end
end
if stale and redis.call('hlen', key) <= 1 then
    -- only 'mode' is left: nobody holds (the attempt below takes the free lock; waiters of
    -- other clients find it free on their next poll)
    redis.call('del', key)
    mode = false
end

local writers = KEYS[2]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('zremrangebyscore', writers, '-inf', now)
local mine = redis.call('zscore', writers, owner)
local waiting = redis.call('zcard', writers)
if mine then
    waiting = waiting - 1
end

-- One more read hold (Redisson's read tryLockInnerAsync: count, its timeout key, and the
-- hash kept at least as long).
local function take_read()
    rcount = redis.call('hincrby', key, owner, 1)
    redis.call('set', timeout_key(owner, rcount), 1, 'px', ttl)
    keep_for(key, ttl)
end

local code
if want == 'read' then
    if mode == 'write' and wcount == 0 then
        code = 0
    elseif rcount > 0 or wcount > 0 then
        -- re-entry, or the writer taking read (downgrade), even while writers wait
        if rcount >= MAX_COUNT then
            code = -3
        else
            take_read()
            code = 1
        end
    elseif waiting > 0 then
        code = -1
    else
        if mode == false then
            redis.call('hset', key, 'mode', 'read')
        end
        take_read()
        code = 1
    end
else
    if wcount > 0 then
        if wcount >= MAX_COUNT then
            code = -3
        else
            wcount = redis.call('hincrby', key, owner .. ':write', 1)
            keep_for(key, ttl)
            code = 1
        end
    elseif rcount > 0 then
        code = -2
    elseif mode ~= false then
        if intent > 0 then
            redis.call('zadd', writers, now + intent, owner)
            local last = redis.call('zrange', writers, -1, -1, 'withscores')
            redis.call('pexpireat', writers, last[2])
        end
        code = 0
    else
        redis.call('hset', key, 'mode', 'write')
        redis.call('hset', key, owner .. ':write', 1)
        redis.call('pexpire', key, ttl)
        wcount = 1
        code = 1
    end
    if code == 1 and mine then
        redis.call('zrem', writers, owner)
    end
end

local wait = 0
if code == 0 or code == -1 then
    wait = redis.call('pttl', key)
    if code == -1 then
        -- the soonest intent of another writer: readers may try again when it lapses
        local first = redis.call('zrange', writers, 0, 1, 'withscores')
        for i = 1, #first, 2 do
            if first[i] ~= owner then
                local left = math.max(tonumber(first[i + 1]) - now, 1)
                if wait < 0 or left < wait then
                    wait = left
                end
                break
            end
        end
    end
end
return { code, rcount + wcount, wait }
