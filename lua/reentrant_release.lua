-- Reentrant release, as Redisson's unlockInnerAsync: give back one hold of the owner, once per
-- request even when the request arrives twice (the client sends it again after a dropped
-- connection, and the first copy may have run).
-- KEYS[1] lock key (a hash)
-- ARGV[1] the message to publish, "0" (Redisson's UNLOCK_MESSAGE)
-- ARGV[2] lease in milliseconds, given to the holds the owner keeps
-- ARGV[3] owner id
-- ARGV[4] the release channel, Redisson's name for it (`redisson_lock__channel:{key}`, or
--         `redisson_lock__channel:key` when the key contains `{`): an argument, not a key, as
--         it need not share the key's cluster slot (PUBLISH is not routed by slot)
-- ARGV[5] request id: new for each release call, the same when the call is sent again
-- The latch: a release that leaves holds writes its request id in the hash field
-- `dlock_unlock_latch` (never an owner id, and not a number: Redisson's RLock scripts only
-- touch the owner's own field and the key as a whole). A second copy of that request finds
-- its id there and changes nothing. The owner's last release deletes the key, field included.
-- Returns nil when the owner holds nothing (expired, or never held: nothing is changed),
-- 0 when the owner still holds it (count decremented, lease renewed; or this request was
-- already applied), and when this was the owner's last hold (key deleted, release published)
-- 1 + the number of subscriber connections that received the message (Redisson returns 1; the
-- count tells the releasing client whether other clients' waiters heard it).
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
if redis.call('hget', KEYS[1], 'dlock_unlock_latch') == ARGV[5] then
    return 0
end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('hset', KEYS[1], 'dlock_unlock_latch', ARGV[5])
    return 0
end
redis.call('del', KEYS[1])
return 1 + redis.call('publish', ARGV[4], ARGV[1])
