-- MultiLock release (and the undo of a partial hold): deletes each key of one group that still
-- holds the hold's value, and publishes each delete on that key's Token release channel, as a
-- Token release does (`lua/unlock.lua`), so that Token and MultiLock waiters wake.
-- KEYS[1..n] the group's keys (one hash slot on a Cluster; at most 1000)
-- ARGV[1] the hold's token
-- ARGV[2] the message to publish: "0", Redisson's unlock message (Token's)
-- ARGV[2+i] the release channel of KEYS[i] (`redisson_lock__channel:{key}`): an argument,
--         not a key (that name need not share the key's slot; PUBLISH is not routed by slot)
-- Returns {deleted, reached}: how many keys held ARGV[1] and were deleted, and how many
-- subscriber connections the publishes reached (summed). Other values are never touched;
-- a key of another type counts as not ours (`pcall`).
local deleted, reached = 0, 0
for i = 1, #KEYS do
    if redis.pcall('get', KEYS[i]) == ARGV[1] then
        redis.call('del', KEYS[i])
        deleted = deleted + 1
        local channel = ARGV[2 + i]
        if channel then
            reached = reached + redis.call('publish', channel, ARGV[2])
        end
    end
end
return {deleted, reached}
