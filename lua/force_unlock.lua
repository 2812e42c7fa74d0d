-- Force unlock (admin): delete the lock key whoever holds it, and publish the release so that
-- waiters wake, as Redisson's `forceUnlock`.
-- KEYS[1] lock key
-- ARGV[1] the release channel ("" = publish nothing: Classic, whose legacy peers poll). An
--         argument, not a key: PUBLISH is not routed by slot.
-- ARGV[2] the message to publish (Redisson's: "0", or "1" after a read-write lock's write)
-- ARGV[3] "" to delete whatever is there, or the read-write mode ("read" or "write") the hash
--         must be in (Redisson's read and write `forceUnlock` each delete only their own mode)
-- Returns 1 when a key was deleted, else 0.
if ARGV[3] ~= '' then
    if redis.call('type', KEYS[1])['ok'] ~= 'hash'
        or redis.call('hget', KEYS[1], 'mode') ~= ARGV[3] then
        return 0
    end
end
if redis.call('del', KEYS[1]) == 1 then
    if ARGV[1] ~= '' then
        redis.call('publish', ARGV[1], ARGV[2])
    end
    return 1
end
return 0
