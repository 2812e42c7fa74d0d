-- Watchdog renewal of many watched holds in one call (in a cluster: keys of one hash slot).
-- Each key is renewed only if its owner still holds it; other owners' keys are never touched.
-- KEYS[i]      lock key of hold i
-- ARGV[3i-2]   how the owner is checked: 'v' (a string value: GET key == owner) or
--              'h' (a hash field, the reentrant layout: HEXISTS key owner)
-- ARGV[3i-1]   the owner: the stored value, or the hash field
-- ARGV[3i]     the lease in milliseconds (>= 1), set with PEXPIRE when the owner matches
-- Returns an array, one entry per key in KEYS order: 1 renewed, 0 absent or not this owner's.
-- A key of the wrong type counts as not the owner's (0) instead of failing the whole batch.
local out = {}
for i = 1, #KEYS do
    local kind, owner, ms = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
    local ours
    if kind == 'v' then
        ours = redis.pcall('get', KEYS[i]) == owner
    else
        ours = redis.pcall('hexists', KEYS[i], owner) == 1
    end
    if ours then
        redis.call('pexpire', KEYS[i], ms)
        out[i] = 1
    else
        out[i] = 0
    end
end
return out
