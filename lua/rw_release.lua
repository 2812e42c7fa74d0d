-- Read-write lock: give back one hold (Redisson's RedissonReadLock / RedissonWriteLock
-- unlockInnerAsync, with its unlock latch), or withdraw a writer's intent. Layout in
-- docs/rwlock.md. Only the owner's own count is touched.
-- KEYS[1] lock key (Redisson's hash, or absent)
-- KEYS[2] waiting writers (sorted set, see rw_acquire.lua)
-- KEYS[3] read/write: unlock latch 'redisson_unlock_latch:{name}:<request id>', a fresh id per
--         release and the same id when the client sends the release again: a release that
--         already ran answers from the latch instead of giving back a second hold
-- ARGV[1] 'read', 'write', or 'wait' (withdraw the owner's writer intent after giving up)
-- ARGV[2] owner id (the lease value)
-- ARGV[3] the channel 'redisson_rwlock:{name}' (an argument, not a key: a channel has no slot)
-- ARGV[4] lease in milliseconds, the least lifetime left to the key after a partial write
--         release (as Redisson's internalLockLeaseTime)
-- ARGV[5] lifetime of the unlock latch in milliseconds
-- ARGV[6] optional: give back a hold only if the owner's read + write holds add up to exactly
--         this many (undoing an acquire whose reply was lost: the count it would have left;
--         if it never ran, the count is lower and nothing changes)
-- Publishes, as Redisson does: read: '0' when the last read hold goes and the hash is
-- deleted; write: '1' when the owner's last write hold goes (the hash deleted, or - beyond
-- Redisson - left in mode 'read' by a downgrade, so that readers wake); wait: '0' when an
-- intent is withdrawn.
-- Returns {code, holds}; holds = the owner's read + write holds afterwards, and code:
--    1  one hold released (or, wait: the intent withdrawn);
--    0  the owner had no hold in that mode (expired, released already, or never ours).
-- Returns the bulk string '<field>=<value>' when the hash is not a read-write lock's (then
-- nothing is changed). A key of another type fails with WRONGTYPE.
local want, owner, channel = ARGV[1], ARGV[2], ARGV[3]
local lease, latch_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
if (want ~= 'read' and want ~= 'write' and want ~= 'wait') or owner == nil or owner == ''
    or channel == nil or lease == nil or lease < 1 or latch_ms == nil or latch_ms < 1 then
    return redis.error_reply('ERR rw_release.lua: bad arguments')
end

-- #include rw_prelude.lua

if want == 'wait' then
    local gone = redis.call('zrem', KEYS[2], owner)
    if gone == 1 then
        redis.call('publish', channel, '0')
    end
    return { gone, rcount + wcount }
end

local latch = KEYS[3]
local done = redis.call('get', latch)
if done then
    return { tonumber(done) or 0, rcount + wcount }
end

local expect = ARGV[6]
if expect ~= nil and tonumber(expect) ~= rcount + wcount then
    return { 0, rcount + wcount }
end

local code = 0
if want == 'read' then
    if rcount > 0 then
        code = 1
        rcount = rcount - 1
        if rcount == 0 then
            redis.call('hdel', key, owner)
        else
            redis.call('hincrby', key, owner, -1)
        end
        redis.call('del', timeout_key(owner, rcount + 1))
        local free = true
        if mode == 'write' then
            -- the writer released a read hold taken while writing: it still holds write
            free = false
        elseif redis.call('hlen', key) > 1 then
            local longest = -3
            local flat = redis.call('hgetall', key)
            for i = 1, #flat, 2 do
                local field = flat[i]
                local c = count_of(flat[i + 1])
                if c and c > 0 and string.sub(field, -6) ~= ':write' then
                    longest = math.max(longest, remain(field, c))
                end
            end
            if longest > 0 then
                redis.call('pexpire', key, longest)
                free = false
            end
        end
        if free then
            redis.call('del', key)
            redis.call('publish', channel, '0')
        end
    end
else
    if mode == 'write' and wcount > 0 then
        code = 1
        wcount = wcount - 1
        if wcount > 0 then
            redis.call('hincrby', key, owner .. ':write', -1)
            keep_for(key, lease)
        else
            redis.call('hdel', key, owner .. ':write')
            if redis.call('hlen', key) == 1 then
                redis.call('del', key)
            else
                redis.call('hset', key, 'mode', 'read')
            end
            redis.call('publish', channel, '1')
        end
    end
end
if code == 1 then
    redis.call('set', latch, code, 'px', latch_ms)
end
return { code, rcount + wcount }
