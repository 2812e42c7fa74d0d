-- Compare-and-delete: release a lock only if it still holds our exact value.
-- Used by both string strategies: Token (value = random token) and Classic (value = our
-- expiry timestamp, so a legacy peer that GETSET our expired lock is never deleted by us).
-- KEYS[1] lock key
-- KEYS[2] (Token only) the release channel, `redisson_lock__channel:{key}`, in the key's slot
-- ARGV[1] the value we wrote when we acquired (or last extended) the lock
-- ARGV[2] (with KEYS[2]) the message to publish, "0" as Redisson's unlock message
-- Returns 0 when the key was absent or not ours; otherwise it is now deleted and the reply is
-- 1 + the number of subscriber connections the release was published to (0 without KEYS[2]),
-- which tells the releasing client whether other clients' waiters heard it.
if redis.call('get', KEYS[1]) == ARGV[1] then
    redis.call('del', KEYS[1])
    if #KEYS > 1 then
        return 1 + redis.call('publish', KEYS[2], ARGV[2])
    end
    return 1
end
return 0
