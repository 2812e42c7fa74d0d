-- MultiLock acquire: takes every key of one group (all keys of the lock on a single server;
-- the keys of one hash slot on a Cluster), all or none, with the same Token value at each.
-- KEYS[1..n] the group's keys, in the lock's canonical order (at most 1000)
-- ARGV[1] the hold's token (32 hex digits, Token's format; the same for every attempt of one
--         acquire)
-- ARGV[2] lifetime in milliseconds
-- Returns {1} when every key was taken: each was absent, or already held ARGV[1] (written by
-- an earlier attempt of the same acquire whose reply was lost), and now holds ARGV[1] with the
-- lifetime. Otherwise {0, i, PTTL of KEYS[i], the value held} for the first key KEYS[i] held
-- by another value ('' for a key of another type), and nothing was written.
-- `pcall`: a key of another type is a refusal, not an error. The loops are bounded by #KEYS.
for i = 1, #KEYS do
    local found = redis.pcall('get', KEYS[i])
    if found ~= false and found ~= ARGV[1] then
        local holder = ''
        if type(found) == 'string' then
            holder = found
        end
        return {0, i, redis.call('pttl', KEYS[i]), holder}
    end
end
for i = 1, #KEYS do
    redis.call('set', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return {1}
