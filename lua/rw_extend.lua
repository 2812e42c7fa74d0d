-- Read-write lock: renew the owner's own holds in one mode (Redisson's layout,
-- docs/rwlock.md). Other owners' holds are never renewed, so a dead owner's hold still
-- expires while live ones keep renewing theirs; nothing is ever shortened.
-- KEYS[1] lock key (Redisson's hash, or absent)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id (the lease value)
-- ARGV[3] new lifetime in milliseconds (>= 1)
-- read: while one of the owner's read timeout keys lives, each of its timeout keys (one per
--       hold) lives at least ARGV[3] more, and so does the hash;
-- write: while the owner holds write, the hash lives at least ARGV[3] more.
-- Returns {code, holds}; holds = the owner's read + write holds, and code:
--    1  extended;  0  the owner holds nothing live in that mode (lost).
-- Returns the bulk string '<field>=<value>' when the hash is not a read-write lock's.
local want, owner, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if (want ~= 'read' and want ~= 'write') or owner == nil or owner == '' or ttl == nil
    or ttl < 1 then
    return redis.error_reply('ERR rw_extend.lua: bad arguments')
end

-- #include rw_prelude.lua

local code = 0
if want == 'read' then
    if rcount > 0 and remain(owner, math.min(rcount, MAX_COUNT)) > 0 then
        for i = 1, math.min(rcount, MAX_COUNT) do
            local k = timeout_key(owner, i)
            local left = redis.call('pttl', k)
            if left ~= -1 and left < ttl then
                redis.call('set', k, 1, 'px', ttl)
            end
        end
        keep_for(key, ttl)
        code = 1
    end
elseif mode == 'write' and wcount > 0 then
    keep_for(key, ttl)
    code = 1
end
return { code, rcount + wcount }
