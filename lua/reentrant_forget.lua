-- Reentrant release retried by the client's janitor after the first try failed on a connection
-- error (so it may or may not have run): give back one hold of the owner only if the owner's
-- count is still the one it had before that release. If the first try ran, the count is one
-- lower (or the key is gone) and nothing is changed, so a hold is never given back twice.
-- KEYS[1] lock key (a hash)
-- ARGV[1] owner id
-- ARGV[2] the owner's hold count before the release that failed
-- ARGV[3] lease in milliseconds, given to the holds the owner keeps
-- ARGV[4] the release channel, `redisson_lock__channel:{key}` (PUBLISH is not routed by slot,
--         so the channel is an argument, not a key)
-- ARGV[5] the message to publish, "0" (Redisson's UNLOCK_MESSAGE)
-- Returns nil when nothing was changed (the release had run, the hold expired, or the count
-- moved), 0 when one hold was given back and others remain, and 1 + the number of subscriber
-- connections the release was published to when that was the owner's last hold (key deleted).
local count = redis.call('hget', KEYS[1], ARGV[1])
if not count or tonumber(count) ~= tonumber(ARGV[2]) then
    return nil
end
if tonumber(count) > 1 then
    redis.call('hincrby', KEYS[1], ARGV[1], -1)
    redis.call('pexpire', KEYS[1], ARGV[3])
    return 0
end
redis.call('del', KEYS[1])
return 1 + redis.call('publish', ARGV[4], ARGV[5])
