-- Reentrant release, as Redisson's unlockInnerAsync: give back one hold of the owner.
-- KEYS[1] lock key (a hash)
-- ARGV[1] the message to publish, "0" (Redisson's UNLOCK_MESSAGE)
-- ARGV[2] lease in milliseconds, given to the holds the owner keeps
-- ARGV[3] owner id
-- ARGV[4] the release channel, `redisson_lock__channel:{key}`: an argument, not a key, as
--         PUBLISH is not routed by slot (a never-existing second key made a Cluster node in the
--         middle of a slot migration answer TRYAGAIN until the migration ended)
-- Returns nil when the owner holds nothing (expired, or never held: nothing is changed),
-- 0 when the owner still holds it (count decremented, lease renewed), and when this was the
-- owner's last hold (key deleted, release published) 1 + the number of subscriber connections
-- that received the message (Redisson returns 1; the count tells the releasing client whether
-- other clients' waiters heard it).
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
return 1 + redis.call('publish', ARGV[4], ARGV[1])
