-- Watchdog renewal of many watched holds in one call (in a cluster: keys of one hash slot).
-- Each key is renewed only if its owner still holds it; other owners' keys are never touched.
-- KEYS[i]      lock key of hold i
-- ARGV[3i-2]   how the owner is checked and renewed:
--              'v' a string value (Token): GET key == owner, then PEXPIRE key lease;
--              'h' a hash field (reentrant, Redisson's layout): HEXISTS key owner, then PEXPIRE;
--              'r' / 'w' the owner's live read / write entry of a read-write lock (field
--              'r:<owner>' / 'w:<owner>' = 'count:expiry ms'): its expiry becomes the later of
--              itself and now + lease, and the key's expiry is moved out to it if earlier
--              (never shortened: other owners' entries may live longer)
-- ARGV[3i-1]   the owner: the stored value, the hash field, or the read-write owner id
-- ARGV[3i]     the lease in milliseconds (>= 1)
-- Returns an array, one entry per key in KEYS order: 1 renewed, 0 absent or not this owner's.
-- A key of the wrong type counts as not the owner's (0) instead of failing the whole batch.
if redis.replicate_commands then redis.replicate_commands() end
local now
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
    elseif kind == 'r' or kind == 'w' then
        local field = kind .. ':' .. owner
        local entry = redis.pcall('hget', key, field)
        if type(entry) == 'string' then
            if now == nil then
                local clock = redis.call('time')
                now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
            end
            local c, e = string.match(entry, '^(%d+):(%d+)$')
            e = tonumber(e)
            if c and e and e > now then
                local exp = math.max(e, now + ms)
                redis.call('hset', key, field, c .. ':' .. string.format('%d', exp))
                local left = redis.call('pttl', key)
                if left >= 0 and left < exp - now then
                    redis.call('pexpireat', key, string.format('%d', exp))
                end
                out[i] = 1
            end
        end
    end
end
return out
