-- Read-write lock: does the owner hold the lock in that mode? Changes nothing.
-- (Redisson's layout, docs/rwlock.md.)
-- KEYS[1] lock key (Redisson's hash, or absent)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id (the lease value)
-- Returns {code, holds}; holds = the owner's read + write holds, and code:
--    1  read: the owner's count is in the hash and one of its read timeout keys lives;
--       write: the hash is in mode 'write' with the owner's write count;
--    0  it does not.
-- Returns the bulk string '<field>=<value>' when the hash is not a read-write lock's.
local want, owner = ARGV[1], ARGV[2]
if (want ~= 'read' and want ~= 'write') or owner == nil or owner == '' then
    return redis.error_reply('ERR rw_held.lua: bad arguments')
end

-- #include rw_prelude.lua

local code = 0
if want == 'read' then
    if rcount > 0 and remain(owner, math.min(rcount, MAX_COUNT)) > 0 then
        code = 1
    end
elseif mode == 'write' and wcount > 0 then
    code = 1
end
return { code, rcount + wcount }
