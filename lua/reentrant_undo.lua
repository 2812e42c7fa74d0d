-- Undo one hold of a reentrant lock (Redisson's RLock layout) only if the owner's count is
-- exactly the expected one. Used after an acquire whose reply was lost: the expected count is
-- the one that acquire would have made, so a hold that was never added (the acquire did not
-- run) or that is no longer there is never given back twice.
-- KEYS[1] lock key (a hash: owner id -> hold count)
-- ARGV[1] owner id (the hash field)
-- ARGV[2] the count the field must have, in decimal
-- ARGV[3] lease in milliseconds, given to the holds that remain
-- ARGV[4] the release channel, published on when the lock becomes free (PUBLISH inside a
--         script is not routed by slot, so it is an argument, not a key)
-- ARGV[5] the message to publish, "0" (Redisson's UNLOCK_MESSAGE)
-- Returns 1 when a hold was given back (the key deleted and the release published if it was
-- the last), 0 when the count differs or the key is not a hash (nothing changed).
local c = redis.pcall('hget', KEYS[1], ARGV[1])
if type(c) ~= 'string' or c ~= ARGV[2] then
    return 0
end
if tonumber(c) > 1 then
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('pexpire', KEYS[1], ARGV[3])
    return 1
end
redis.call('hdel', KEYS[1], ARGV[1])
-- Free when no owner is left: nothing, or only the release latch (reentrant_release.lua).
local left = redis.call('hlen', KEYS[1])
if left == 0 or (left == 1 and redis.call('hexists', KEYS[1], 'dlock_unlock_latch') == 1) then
    redis.call('del', KEYS[1])
    redis.call('publish', ARGV[4], ARGV[5])
end
return 1
