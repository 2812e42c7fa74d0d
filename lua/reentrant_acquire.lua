-- Reentrant acquire in Redisson's RLock layout: a hash at the lock key, field = owner id
-- (`<client UUID>:<thread number>`), value = the owner's hold count, PEXPIRE = the lease.
-- The same test as Redisson's tryLockInnerAsync, so either side refuses the other's holds.
-- KEYS[1] lock key (a hash)
-- KEYS[2] (optional) fencing counter, in the lock key's hash slot (`dlock_fence:{key}`)
-- ARGV[1] lease in milliseconds
-- ARGV[2] owner id
-- ARGV[3] (optional) the owner's hold count as the calling thread knows it: a larger count
--         of the owner's is a hold it gave up but the server kept (a release done on a primary
--         that failed over before replicating it), and is set back to this count first, so
--         that the stale hold does not outlive the owner's next release
-- Returns {1, fence} when taken or re-entered (fence: INCR of KEYS[2] for a new hold; for a
-- re-entry the counter's current value, which the owner's outer hold set; 0 without KEYS[2]),
-- {0, PTTL of the key} when another owner holds it. A key of another type fails with
-- WRONGTYPE (from HEXISTS).
local exists = redis.call('exists', KEYS[1]) == 1
if not exists or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local known = tonumber(ARGV[3])
    -- (a new hash has no stale count: no HGET on the uncontended path)
    if exists and known and (tonumber(redis.call('hget', KEYS[1], ARGV[2])) or 0) > known then
        if known > 0 then
            redis.call('hset', KEYS[1], ARGV[2], known)
        else
            redis.call('hdel', KEYS[1], ARGV[2])
        end
    end
    local count = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    if #KEYS < 2 then
        return {1, 0}
    end
    if count == 1 then
        return {1, redis.call('incr', KEYS[2])}
    end
    -- Missing counter (the outer hold was not fenced and no fenced hold ever existed):
    -- start it, so the token is still greater than every earlier one.
    local fence = redis.call('get', KEYS[2])
    if not fence then
        return {1, redis.call('incr', KEYS[2])}
    end
    return {1, tonumber(fence)}
end
return {0, redis.call('pttl', KEYS[1])}
