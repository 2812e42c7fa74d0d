-- Compare-and-delete: release a lock only if it still holds our exact value.
-- Used by the string strategies: Token (value = random token), Spring (value = a UUID) and
-- Classic (value = our expiry timestamp, so a legacy peer that GETSET our expired lock is never
-- deleted by us).
-- KEYS[1] lock key
-- ARGV[1] the value we wrote when we acquired (or last extended) the lock
-- ARGV[2] (optional) the message to publish: "0" as Redisson's unlock message (Token), the
--         lock key (Spring's registry)
-- ARGV[3..] (with ARGV[2]) the channels to publish it on, in order: Redisson's
--         `redisson_lock__channel:{key}` (Token); the registry's two generations of channel
--         (Spring). Arguments, not keys: those names need not share the key's cluster slot,
--         and PUBLISH is not routed by slot.
-- Returns 0 when the key was absent or not ours; otherwise it is now deleted and the reply is
-- 1 + the number of subscriber connections the release was published to (summed over the
-- channels; 0 without any), which tells the releasing client whether other clients' waiters
-- heard it.
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    local reached = 0
    for i = 3, #ARGV do
        reached = reached + redis.call('publish', ARGV[i], ARGV[2])
    end
    return 1 + reached
end
return 0
