-- Semaphore: give permits back (Redisson's RPermitExpirableSemaphore layout, see
-- semaphore_acquire.lua).
-- KEYS[1]   the semaphore's name: the count of free permits
-- KEYS[2]   the permits taken: the sorted set '{name}:timeout'
-- ARGV[1]   the channel releases are announced on ('redisson_sc:{name}')
-- ARGV[2..] the permits' ids, raw 16 bytes each (at most 1000)
-- Clock: the server's (TIME). First, expired permits are reclaimed (at most 100), as in
-- semaphore_acquire.lua. Then each id still in the set is removed and the count raised by
-- how many were; the new count is published if positive (as Redisson's release does), so
-- that waiters wake. Giving back an id twice gives it back once: the janitor may resend a
-- release.
-- Returns {given back, of those past their expiry}: the caller's permits were all still its
-- own when the first equals the number of ids and the second is 0.
-- #include semaphore_reclaim.lua
reclaim(100, ARGV[1])
local removed, late = 0, 0
for i = 2, #ARGV do
    local score = redis.call('zscore', KEYS[2], ARGV[i])
    if score then
        redis.call('zrem', KEYS[2], ARGV[i])
        removed = removed + 1
        if tonumber(score) <= now then
            late = late + 1
        end
    end
end
if removed > 0 then
    local value = redis.call('incrby', KEYS[1], removed)
    -- Only a positive count: Redisson's waiters release their latch by min(waiters, message),
    -- and a negative one (a count below 0 after addPermits) throws in its listener.
    if value > 0 then
        redis.call('publish', ARGV[1], value)
    end
end
return {removed, late}
