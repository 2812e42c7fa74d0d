-- Read-write lock: give back one hold, or withdraw a writer's intent. All state is the hash at
-- KEYS[1] (docs/rwlock.md). Only the owner's own entry is touched: a release naming an owner
-- that holds nothing in that mode changes nothing (expired entries are still purged).
-- KEYS[1] lock key (a hash, or absent)
-- ARGV[1] 'read', 'write', or 'wait' (withdraw the owner's writer intent after giving up)
-- ARGV[2] owner id '<instance hex>:<thread hex>' (the lease value)
-- ARGV[3] (optional) release channel `redisson_lock__channel:{key}`: when an entry goes (its
--         last hold released, or an intent withdrawn) "0" is published there, waking waiters.
--         An argument, not a key: PUBLISH is not routed by slot, and a never-existing second
--         key made a Cluster node in a slot migration answer TRYAGAIN until it ended
-- Returns {code, holds}; holds = the owner's read + write holds afterwards, and code:
--    1  one hold released (the entry goes when its count reaches 0; when the writer's last
--       write hold goes while it still holds read, the mode becomes 'read': a downgrade);
--    0  the owner had no live entry in that mode (expired, released already, or never ours).
-- Returns the bulk string '<field>=<value>' when the hash holds an entry this lock did not write
-- (then nothing is changed). A key of another type fails with WRONGTYPE.
local tags = { read = 'r', write = 'w', wait = 'wait' }
local tag, owner = tags[ARGV[1]], ARGV[2]
if tag == nil or owner == nil or owner == '' then
    return redis.error_reply('ERR rw_release.lua: bad arguments')
end

-- #include rw_prelude.lua

local code = 0
local h = holds[tag][owner]
if h then
    put(tag, owner, h.count - 1, h.exp)
    code = 1
    if h.count == 1 and ARGV[3] then
        redis.call('PUBLISH', ARGV[3], '0')
    end
end
finish()
return { code, total(owner) }
