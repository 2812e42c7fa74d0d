-- Compare-and-delete: release a lock only if it still holds our exact value.
-- Used by both strategies: Token (value = random token) and Classic (value = our expiry
-- timestamp, so a legacy peer that GETSET our expired lock is never deleted by us).
-- KEYS[1] lock key
-- ARGV[1] the value we wrote when we acquired (or last extended) the lock
-- Returns 1 when the key was ours and is now deleted, 0 when it was absent or not ours.
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
