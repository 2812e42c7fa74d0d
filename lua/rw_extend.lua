-- Read-write lock: renew the owner's own read or write entry (all its holds in that mode share
-- one expiry). All state is the hash at KEYS[1] (docs/rwlock.md). Other owners' entries are
-- never renewed, so a dead owner's hold still expires while live ones keep renewing theirs.
-- KEYS[1] lock key (a hash, or absent)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id '<instance hex>:<thread hex>' (the lease value)
-- ARGV[3] new lifetime in milliseconds (>= 1); the entry then lives until the later of its
--         current expiry and now + ARGV[3] (never shortened: other leases of the same owner
--         may count on the later expiry)
-- Returns {code, holds}; holds = the owner's read + write holds, and code:
--    1  extended;  0  the owner has no live entry in that mode (lost).
-- Returns the bulk string '<field>=<value>' when the hash holds an entry this lock did not write
-- (then nothing is changed). A key of another type fails with WRONGTYPE.
local tags = { read = 'r', write = 'w' }
local tag, owner, ttl = tags[ARGV[1]], ARGV[2], tonumber(ARGV[3])
if tag == nil or owner == nil or owner == '' or ttl == nil or ttl < 1 then
    return redis.error_reply('ERR rw_extend.lua: bad arguments')
end

-- #include rw_prelude.lua

local code = 0
local h = holds[tag][owner]
if h then
    put(tag, owner, h.count, math.max(h.exp, now + ttl))
    code = 1
end
finish()
return { code, total(owner) }
