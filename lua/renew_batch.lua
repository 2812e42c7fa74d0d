-- Watchdog renewal of many watched holds in one call (in a cluster: keys of one hash slot).
-- Each key is renewed only if its owner still holds it; other owners' keys are never touched.
-- KEYS[i]      lock key of hold i
-- ARGV[3i-2]   how the owner is checked and renewed:
--              'v' a string value (Token): GET key == owner, then PEXPIRE key lease;
--              'h' a hash field (reentrant, Redisson's layout): HEXISTS key owner, then PEXPIRE;
--              'r' the owner's read holds of a read-write lock (Redisson's layout: field
--              '<owner>' = count, one key '<base>:<owner>:rwlock_timeout:<j>' per hold, <base>
--              = the key if it contains '{', else '{key}'): while one of those keys lives,
--              each of them lives at least lease more, and so does the hash;
--              'w' the owner's write holds ('<owner>:write' in a hash in mode 'write'): the
--              hash lives at least lease more
--              ('r' and 'w' never shorten anything: other owners' holds may live longer)
--              'z' a member of a sorted set scored by its expiry in epoch ms (Redisson's
--              permit layout): ZSCORE key owner, then its score becomes the server's time
--              (TIME) plus lease; the key's own expiry is left alone
-- ARGV[3i-1]   the owner: the stored value, the hash field, the read-write owner id, or the
--              sorted set's member
-- ARGV[3i]     the lease in milliseconds (>= 1)
-- Returns an array, one entry per key in KEYS order: 1 renewed, 0 absent or not this owner's.
-- A key of the wrong type counts as not the owner's (0) instead of failing the whole batch.
-- Every loop is bounded (a read count is at most 10000, as the read-write lock enforces).
-- TIME ('z') before a write: effects replication (the default from Redis 5).
if redis.replicate_commands then redis.replicate_commands() end
local now = nil
local out = {}
for i = 1, #KEYS do
    local kind, owner, ms = ARGV[3 * i - 2], ARGV[3 * i - 1], tonumber(ARGV[3 * i])
    local key = KEYS[i]
    out[i] = 0
    if kind == 'v' or kind == 'h' then
        local ours
        if kind == 'v' then
            ours = redis.pcall('get', key) == owner
        else
            ours = redis.pcall('hexists', key, owner) == 1
        end
        if ours then
            redis.call('pexpire', key, ms)
            out[i] = 1
        end
    elseif kind == 'z' then
        if type(redis.pcall('zscore', key, owner)) == 'string' then
            if not now then
                local t = redis.call('time')
                now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
            end
            redis.call('zadd', key, now + ms, owner)
            out[i] = 1
        end
    elseif kind == 'r' or kind == 'w' then
        local field = owner
        if kind == 'w' then
            field = owner .. ':write'
        end
        local c = redis.pcall('hget', key, field)
        local n = nil
        if type(c) == 'string' and #c <= 9 and string.match(c, '^%d+$') then
            n = math.min(tonumber(c), 10000)
        end
        if n and n > 0 and kind == 'w' then
            if redis.call('hget', key, 'mode') == 'write' then
                out[i] = 1
            end
        elseif n and n > 0 then
            local base = key
            if not string.find(key, '{', 1, true) then
                base = '{' .. key .. '}'
            end
            local prefix = base .. ':' .. owner .. ':rwlock_timeout:'
            local lefts = {}
            for j = 1, n do
                lefts[j] = redis.call('pttl', prefix .. j)
                if lefts[j] > 0 then
                    out[i] = 1
                end
            end
            if out[i] == 1 then
                for j = 1, n do
                    if lefts[j] ~= -1 and lefts[j] < ms then
                        redis.call('set', prefix .. j, 1, 'px', ms)
                    end
                end
            end
        end
        if out[i] == 1 then
            local left = redis.call('pttl', key)
            if left >= 0 and left < ms then
                redis.call('pexpire', key, ms)
            end
        end
    end
end
return out
