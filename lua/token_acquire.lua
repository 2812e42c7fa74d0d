-- Token acquire for a waiting thread or a fenced lock: SET NX PX, and in the same step the
-- fencing token on success or the holder's remaining lifetime on refusal.
-- KEYS[1] lock key
-- KEYS[2] (optional) fencing counter, in the lock key's hash slot (`dlock_fence:{key}`)
-- ARGV[1] our token
-- ARGV[2] lifetime in milliseconds
-- Returns {1, fence} when taken (fence = INCR of KEYS[2], or 0 without it), {0, PTTL of the
-- key} when held by another owner.
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if #KEYS > 1 then
        return {1, redis.call('incr', KEYS[2])}
    end
    return {1, 0}
end
return {0, redis.call('pttl', KEYS[1])}
