-- Shared opening of every lua/rw_*.lua script (read-write lock). Not a script of its own:
-- src/scripts.rs puts it in place of the line `-- #include rw_prelude.lua` of each rw script
-- when the client is built (Redis scripts cannot load each other).
-- Expects the including script to have set `owner` (the owner id) before this point.
-- Reads the whole hash, refuses anything it did not write, drops expired entries.
-- holds.r / holds.w / holds.wait map owner -> { count = n, exp = server ms } (live only).
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local holds = { r = {}, w = {}, wait = {} }
local dirty = false
do
    local flat = redis.call('HGETALL', key)
    local expired = {}
    for i = 1, #flat, 2 do
        local field, value = flat[i], flat[i + 1]
        if field == 'mode' then
            if value ~= 'read' and value ~= 'write' then
                return field .. '=' .. value
            end
        else
            local sep = string.find(field, ':', 1, true)
            local tag = sep and string.sub(field, 1, sep - 1)
            local owner = sep and string.sub(field, sep + 1)
            local count, exp
            if tag == 'wait' then
                count, exp = 1, tonumber(string.match(value, '^%d+$'))
            elseif tag == 'r' or tag == 'w' then
                local c, e = string.match(value, '^(%d+):(%d+)$')
                count, exp = tonumber(c), tonumber(e)
            end
            if count == nil or exp == nil or count < 1 or owner == nil or owner == '' then
                return field .. '=' .. value
            end
            if exp <= now then
                expired[#expired + 1] = field
            else
                holds[tag][owner] = { count = count, exp = exp }
            end
        end
    end
    for _, field in ipairs(expired) do
        redis.call('HDEL', key, field)
        dirty = true
    end
end

-- Sets owner's entry under tag (count 0 deletes it).
local function put(tag, owner, count, exp)
    local field = tag .. ':' .. owner
    if count < 1 then
        holds[tag][owner] = nil
        redis.call('HDEL', key, field)
    else
        holds[tag][owner] = { count = count, exp = exp }
        if tag == 'wait' then
            redis.call('HSET', key, field, string.format('%d', exp))
        else
            redis.call('HSET', key, field, string.format('%d:%d', count, exp))
        end
    end
    dirty = true
end

-- After any change: 'mode' follows the live holds and the key expires with the latest entry.
local function finish()
    if not dirty then
        return
    end
    local latest = 0
    for _, owners in pairs(holds) do
        for _, h in pairs(owners) do
            if h.exp > latest then
                latest = h.exp
            end
        end
    end
    if latest == 0 then
        redis.call('DEL', key)
        return
    end
    if next(holds.w) then
        redis.call('HSET', key, 'mode', 'write')
    elseif next(holds.r) then
        redis.call('HSET', key, 'mode', 'read')
    else
        redis.call('HDEL', key, 'mode')
    end
    redis.call('PEXPIREAT', key, string.format('%d', latest))
end

-- The owner's holds in both modes.
local function total(owner)
    local n = 0
    if holds.r[owner] then
        n = n + holds.r[owner].count
    end
    if holds.w[owner] then
        n = n + holds.w[owner].count
    end
    return n
end
