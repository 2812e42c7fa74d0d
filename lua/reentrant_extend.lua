-- Reentrant extend, as Redisson's renewExpirationAsync: a new lease for the key, only while
-- the owner holds it. The lease covers every hold of the key (they share its expiry).
-- KEYS[1] lock key (a hash)
-- ARGV[1] owner id
-- ARGV[2] lease in milliseconds
-- Returns 1 when renewed, 0 when the owner holds nothing.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
return 0
