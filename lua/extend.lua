-- Compare-and-pexpire (Token strategy): give our lock a new time to live, only if it is ours.
-- KEYS[1] lock key
-- ARGV[1] our token
-- ARGV[2] new time to live in milliseconds (> 0)
-- Returns 1 when extended, 0 when the key was absent or held by another token.
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
