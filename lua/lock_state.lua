-- The state of a lock key, whoever holds it (the admin queries `is_locked`, `remaining_ttl`).
-- Reads only.
-- KEYS[1] lock key
-- ARGV[1] what else to read: "value" (a string key's value: Classic, RedLock), "mode" (a
--         hash's field `mode`: the read-write lock, as Redisson's `isLocked`), or "" (nothing)
-- Returns {type, pttl, detail}: the key's TYPE ("none" when absent), its PTTL (-2 absent, -1
-- no expiry) and the detail asked for (nil when not asked for or not there).
local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
    return {kind, -2, false}
end
local detail = false
if ARGV[1] == 'value' and kind == 'string' then
    detail = redis.call('get', KEYS[1])
elseif ARGV[1] == 'mode' and kind == 'hash' then
    detail = redis.call('hget', KEYS[1], 'mode')
end
return {kind, redis.call('pttl', KEYS[1]), detail}
