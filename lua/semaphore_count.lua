-- Semaphore: read or set the count (Redisson's RPermitExpirableSemaphore layout, see
-- semaphore_acquire.lua).
-- KEYS[1]   the semaphore's name: the count of free permits
-- KEYS[2]   the permits taken: the sorted set '{name}:timeout'
-- ARGV[1]   what to do:
--           'available': reclaim expired permits (at most 1000 per call; clock: the server's
--                        TIME), publishing the new count if positive, as Redisson's
--                        availablePermits does; returns the count (0 if never set)
--           'set':       Redisson's trySetPermits: set the count to ARGV[3] only if it was
--                        never set, and publish it; returns 1 if set, else 0
--           'add':       Redisson's addPermits: add ARGV[3] (may be negative) to the count
--                        (absent: 0), publishing ARGV[3] if positive; returns the new count
-- ARGV[2]   the channel ('redisson_sc:{name}')
-- ARGV[3]   the permits ('set', 'add')
-- #include semaphore_reclaim.lua
local op = ARGV[1]
if op == 'available' then
    return reclaim(1000, ARGV[2]) or tonumber(redis.call('get', KEYS[1]) or '0')
elseif op == 'set' then
    if redis.call('get', KEYS[1]) == false then
        redis.call('set', KEYS[1], ARGV[3])
        redis.call('publish', ARGV[2], ARGV[3])
        return 1
    end
    return 0
elseif op == 'add' then
    local value = tonumber(redis.call('get', KEYS[1]) or '0') + tonumber(ARGV[3])
    redis.call('set', KEYS[1], value)
    if tonumber(ARGV[3]) > 0 then
        redis.call('publish', ARGV[2], ARGV[3])
    end
    return value
end
return redis.error_reply('semaphore_count: unknown operation')
