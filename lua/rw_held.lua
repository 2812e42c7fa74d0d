-- Read-write lock: does the owner hold a live read or write entry? All state is the hash at
-- KEYS[1] (docs/rwlock.md). Changes nothing but the purge of expired entries.
-- KEYS[1] lock key (a hash, or absent)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id '<instance hex>:<thread hex>' (the lease value)
-- Returns {code, holds}; holds = the owner's read + write holds, and code:
--    1  the owner holds the lock in that mode;  0  it does not.
-- Returns the bulk string '<field>=<value>' when the hash holds an entry this lock did not write.
-- A key of another type fails with WRONGTYPE.
local tags = { read = 'r', write = 'w' }
local tag, owner = tags[ARGV[1]], ARGV[2]
if tag == nil or owner == nil or owner == '' then
    return redis.error_reply('ERR rw_held.lua: bad arguments')
end

-- #include rw_prelude.lua

local code = 0
if holds[tag][owner] then
    code = 1
end
finish()
return { code, total(owner) }
