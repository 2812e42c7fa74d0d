-- Token acquire for a waiting thread or a fenced lock: SET NX PX, and in the same step the
-- fencing token on success or the holder's remaining lifetime and value on refusal.
-- KEYS[1] lock key
-- KEYS[2] (optional) fencing counter, in the lock key's hash slot (`dlock_fence:{key}`)
-- ARGV[1] our token (the same for every attempt of one blocking acquire)
-- ARGV[2] lifetime in milliseconds
-- Returns {1, fence} when taken (fence = INCR of KEYS[2], or 0 without it), {0, PTTL of the
-- key, the value held} when held by another owner ('' for a key of another type).
--
-- A key that already holds our token was written by an earlier attempt of the same acquire
-- whose reply was lost (a failover, a reset connection): it is ours, taken now with a fresh
-- lifetime. `pcall`: a key of another type is refused as before, not an error.
local taken = redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local holder = ''
if not taken then
    local found = redis.pcall('get', KEYS[1])
    if found == ARGV[1] then
        taken = redis.call('pexpire', KEYS[1], ARGV[2]) == 1
    elseif type(found) == 'string' then
        holder = found
    end
end
if taken then
    if #KEYS > 1 then
        return {1, redis.call('incr', KEYS[2])}
    end
    return {1, 0}
end
return {0, redis.call('pttl', KEYS[1]), holder}
