-- Fair lock: the shared queue walk of lua/fair_acquire.lua and lua/fair_release.lua, put in
-- place of their `-- #include fair_live_head.lua` line when the client is built (Redis scripts
-- cannot load one another). Uses KEYS[2] (queue), KEYS[3] (deadlines) and the caller's local
-- `now` (server time in ms).
-- The live head of the queue: lapsed entries are dropped first (at most 1,000 by deadline, in
-- batches of 100, and 100 more from the head). Returns the head's token or nil, and true when
-- more lapsed entries are left than one call drops (the next call goes on).
local function live_head()
    for _ = 1, 10 do
        local lapsed = redis.call('zrangebyscore', KEYS[3], '-inf', now - 1, 'limit', 0, 100)
        if #lapsed == 0 then
            break
        end
        redis.call('zrem', KEYS[2], unpack(lapsed))
        redis.call('zrem', KEYS[3], unpack(lapsed))
    end
    for _ = 1, 100 do
        local h = redis.call('zrange', KEYS[2], 0, 0)[1]
        if not h then
            return nil, false
        end
        local d = redis.call('zscore', KEYS[3], h)
        if d and tonumber(d) >= now then
            return h, false
        end
        redis.call('zrem', KEYS[2], h)
        redis.call('zrem', KEYS[3], h)
    end
    return nil, true
end
