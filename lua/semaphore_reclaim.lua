-- The opening of the semaphore scripts, which include it by a line
-- '-- #include semaphore_reclaim.lua' (scripts cannot load one another): the server's time,
-- and `reclaim`, the give-back of expired permits that each of Redisson's scripts starts with.
-- KEYS[1]   the semaphore's name: the count of free permits
-- KEYS[2]   the permits taken: the sorted set '{name}:timeout', scores their expiry in epoch ms
-- now       the server's time in epoch milliseconds (TIME before a write: effects replication,
--           the only mode from Redis 7, the default from Redis 5)
-- reclaim(limit, channel): removes at most `limit` permits scored at or before now, adds them
--           back to the count, and publishes the new count on `channel` if it is positive;
--           returns the new count, or nil when none had expired
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function reclaim(limit, channel)
    local expired = redis.call('zrangebyscore', KEYS[2], 0, now, 'limit', 0, limit)
    if #expired == 0 then
        return nil
    end
    redis.call('zrem', KEYS[2], unpack(expired))
    local value = redis.call('incrby', KEYS[1], #expired)
    if value > 0 then
        redis.call('publish', channel, value)
    end
    return value
end
