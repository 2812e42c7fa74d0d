-- Shared opening of every lua/rw_*.lua script (read-write lock in Redisson's RReadWriteLock
-- layout, see docs/rwlock.md). Not a script of its own: src/scripts.rs puts it in place of the
-- line `-- #include rw_prelude.lua` of each rw script when the client is built.
-- Expects the including script to have set `owner` (the owner id) before this point.
--
-- The hash at KEYS[1] is Redisson's: 'mode' = 'read' | 'write'; '<owner>' = the owner's read
-- hold count; '<owner>:write' = the owner's write hold count. Each read hold i of an owner has
-- its own string key '<base>:<owner>:rwlock_timeout:<i>' (value 1, PEXPIRE = that hold's
-- lifetime), where <base> is the name when it contains '{' and '{name}' otherwise (Redisson's
-- suffixName), so every key is in the name's hash slot. The hash itself expires with the
-- latest hold. Nothing else is ever written to the hash: Redisson's scripts walk every field
-- with a numeric value.
--
-- Every loop here is bounded: no input can make a script of this library run long.
if redis.replicate_commands then redis.replicate_commands() end
local key = KEYS[1]
local base = key
if not string.find(key, '{', 1, true) then
    base = '{' .. key .. '}'
end
-- Deepest re-entry of one owner in one mode (acquire refuses beyond it).
local MAX_COUNT = 10000
-- Most PTTL calls one walk over the hash may make; past it, holds count as alive.
local budget = 100000

-- A hold count: a decimal of 1 to 9 digits, else nil (never tonumber on anything else).
local function count_of(v)
    if type(v) ~= 'string' or #v > 9 or not string.match(v, '^%d+$') then
        return nil
    end
    return tonumber(v)
end

local function timeout_key(field, i)
    return base .. ':' .. field .. ':rwlock_timeout:' .. i
end

-- The longest remaining lifetime (ms, PTTL) among the first c read holds of field, as
-- Redisson's read-unlock computes it; past the walk budget the hash's own PTTL (alive).
local function remain(field, c)
    if c > budget then
        budget = 0
        return math.max(redis.call('pttl', key), 1)
    end
    budget = budget - c
    local best = -3
    for i = c, 1, -1 do
        local left = redis.call('pttl', timeout_key(field, i))
        if left > best then
            best = left
        end
    end
    return best
end

-- The key's expiry becomes at least ms from now (never shortened).
local function keep_for(k, ms)
    local left = redis.call('pttl', k)
    if left ~= -2 and left < ms then
        redis.call('pexpire', k, ms)
    end
end

local mode = redis.call('hget', key, 'mode')
if mode == false then
    if redis.call('exists', key) == 1 then
        return 'mode=(missing: not a read-write lock)'
    end
elseif mode ~= 'read' and mode ~= 'write' then
    return 'mode=' .. mode
end
local rcount, wcount = 0, 0
do
    local r = redis.call('hget', key, owner)
    local w = redis.call('hget', key, owner .. ':write')
    if r then
        rcount = count_of(r)
        if rcount == nil then
            return owner .. '=' .. r
        end
    end
    if w then
        wcount = count_of(w)
        if wcount == nil then
            return owner .. ':write=' .. w
        end
    end
end
