-- Compare-and-set (Classic strategy), same value format as the legacy GETSET lockers.
-- Used for two things:
--  * takeover of a stale lock: ARGV[1] is the stale expiry we read with GET; only the first
--    contender whose read still matches wins, and losers overwrite nothing (GETSET's flaw);
--  * extend: ARGV[1] is our current expiry, ARGV[2] the later one.
-- KEYS[1] lock key
-- ARGV[1] expected current value (exact bytes)
-- ARGV[2] new value (expiry timestamp in the lock's encoding)
-- ARGV[3] Redis time to live in milliseconds, or 0 for none (legacy lockers set none)
-- Returns 1 when the value matched and was replaced, 0 otherwise (absent or changed).
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
    redis.call('set', KEYS[1], ARGV[2], 'PX', ttl)
else
    redis.call('set', KEYS[1], ARGV[2])
end
return 1
