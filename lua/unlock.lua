-- Compare-and-delete: release a lock only if it still holds our exact value.
-- Used by both string strategies: Token (value = random token) and Classic (value = our
-- expiry timestamp, so a legacy peer that GETSET our expired lock is never deleted by us).
-- KEYS[1] lock key
-- ARGV[1] the value we wrote when we acquired (or last extended) the lock
-- ARGV[2] (Token only) the message to publish, "0" as Redisson's unlock message
-- ARGV[3] (Token only) the release channel, Redisson's name for it: `redisson_lock__channel:{key}`
--         (or `redisson_lock__channel:key` when the key contains `{`). An argument, not a key:
--         that name need not share the key's cluster slot, and PUBLISH is not routed by slot.
-- Returns 0 when the key was absent or not ours; otherwise it is now deleted and the reply is
-- 1 + the number of subscriber connections the release was published to (0 without ARGV[3]),
-- which tells the releasing client whether other clients' waiters heard it.
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    if #ARGV > 2 then
        return 1 + redis.call('publish', ARGV[3], ARGV[2])
    end
    return 1
end
return 0
