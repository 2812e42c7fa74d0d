-- Fair lock: the shared queue walk of lua/fair_acquire.lua and lua/fair_release.lua, put in
-- place of their `-- #include fair_live_head.lua` line when the client is built (Redis scripts
-- cannot load one another). Uses KEYS[2] (queue), KEYS[3] (deadlines) and the caller's
-- `clock()`, which sets the caller's locals `t` (the server's TIME) and `now` (server time in ms)
-- if they are not set yet.
-- live_head(first) takes the live head out of the queue: the earliest entry is popped and its
-- deadline read and removed; if the deadline has passed it is dropped and the next one is
-- looked at. first: the earliest entry if the caller popped it already (ZPOPMIN), else nil.
-- The first lapsed head also sweeps the lapsed entries by deadline (at most 1,000, in
-- batches of 100), so that a crowd of dead waiters costs a few calls, not a few per waiter.
-- Returns the head's token (no longer queued) or nil, and true when 100 lapsed heads were
-- dropped without finding a live one (the next call goes on).
-- Calls when a live waiter heads the queue: ZPOPMIN, ZSCORE, ZREM (and TIME, if the caller
-- has not read it yet); when the queue is empty, ZPOPMIN.
local function live_head(first)
    for i = 1, 100 do
        local h = first
        if i > 1 or not h then
            h = redis.call('zpopmin', KEYS[2])[1]
        end
        if not h then
            return nil, false
        end
        clock()
        local d = redis.call('zscore', KEYS[3], h)
        redis.call('zrem', KEYS[3], h)
        if d and tonumber(d) >= now then
            return h, false
        end
        if i == 1 then
            for _ = 1, 10 do
                local lapsed = redis.call('zrangebyscore', KEYS[3], '-inf', now - 1, 'limit', 0,
                    100)
                if #lapsed == 0 then
                    break
                end
                redis.call('zrem', KEYS[2], unpack(lapsed))
                redis.call('zrem', KEYS[3], unpack(lapsed))
            end
        end
    end
    return nil, true
end
