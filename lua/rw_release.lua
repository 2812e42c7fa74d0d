-- Read-write lock: give back one hold, or withdraw a writer's intent. All state is the hash at
-- KEYS[1] (docs/rwlock.md). Only the owner's own entry is touched: a release naming an owner
-- that holds nothing in that mode changes nothing (expired entries are still purged).
-- KEYS[1] lock key (a hash, or absent)
-- ARGV[1] 'read', 'write', or 'wait' (withdraw the owner's writer intent after giving up)
-- ARGV[2] owner id '<instance hex>:<thread hex>' (the lease value)
-- Returns {code, holds}; holds = the owner's read + write holds afterwards, and code:
--    1  one hold released (the entry goes when its count reaches 0; when the writer's last
--       write hold goes while it still holds read, the mode becomes 'read': a downgrade);
--    0  the owner had no live entry in that mode (expired, released already, or never ours).
-- Returns the bulk string '<field>=<value>' when the hash holds an entry this lock did not write
-- (then nothing is changed). A key of another type fails with WRONGTYPE.
-- Pub/sub wake-ups (planned): this is where a release that lets others in will PUBLISH.
local tags = { read = 'r', write = 'w', wait = 'wait' }
local tag, owner = tags[ARGV[1]], ARGV[2]
if tag == nil or owner == nil or owner == '' then
    return redis.error_reply('ERR rw_release.lua: bad arguments')
end

-- ---- shared prelude: identical in every lua/rw_*.lua (a unit test checks it) -------------
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
-- ---- end of shared prelude -------------------------------------------------------------

local code = 0
local h = holds[tag][owner]
if h then
    put(tag, owner, h.count - 1, h.exp)
    code = 1
end
finish()
return { code, total(owner) }
