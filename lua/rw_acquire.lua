-- Read-write lock: take one read or write hold. All state is the hash at KEYS[1]; the layout,
-- the rules and the fairness policy are described in docs/rwlock.md.
-- KEYS[1] lock key (a hash, or absent)
-- ARGV[1] 'read' or 'write'
-- ARGV[2] owner id '<instance hex>:<thread hex>'
-- ARGV[3] lifetime of the hold in milliseconds (>= 1)
-- ARGV[4] write only: lifetime in milliseconds of the "writer waiting" intent left when the
--         attempt is refused (0 leaves none; a single try_lock passes 0)
-- Returns {code, holds, wait}; holds = the owner's read + write holds afterwards; wait = on a
-- refusal, milliseconds until the earliest entry of another owner expires (how long a waiter
-- woken by pub/sub may sleep if no release is published), else 0; and code:
--    1  acquired (a first hold, or one more for the same owner);
--    0  refused: read: another owner holds write; write: other owners hold read or write
--       (the intent, if asked for, is left or refreshed);
--   -1  read refused: a writer waits (an unexpired intent of another owner) and this owner
--       holds nothing yet; owners already holding read or write may always re-enter;
--   -2  write refused: the owner holds read but not write (no upgrades; nothing is changed).
-- Returns the bulk string '<field>=<value>' when the hash holds an entry this lock did not write
-- (then nothing is changed). A key of another type fails with WRONGTYPE.
local mode, owner = ARGV[1], ARGV[2]
local ttl, intent = tonumber(ARGV[3]), tonumber(ARGV[4])
if (mode ~= 'read' and mode ~= 'write') or owner == nil or owner == ''
    or ttl == nil or ttl < 1 or intent == nil or intent < 0 then
    return redis.error_reply('ERR rw_acquire.lua: bad arguments')
end

-- #include rw_prelude.lua

-- True if an owner other than ours is in the set.
local function others(set)
    for o in pairs(set) do
        if o ~= owner then
            return true
        end
    end
    return false
end

-- One more hold for the owner under tag; the entry lives until the later of its expiry and
-- now + ttl.
local function take(tag)
    local exp = now + ttl
    local h = holds[tag][owner]
    if h then
        put(tag, owner, h.count + 1, math.max(h.exp, exp))
    else
        put(tag, owner, 1, exp)
    end
end

local code
if mode == 'read' then
    if others(holds.w) then
        code = 0
    elseif holds.r[owner] or holds.w[owner] then
        take('r') -- re-entry, or the writer taking read (downgrade)
        code = 1
    elseif others(holds.wait) then
        code = -1
    else
        take('r')
        code = 1
    end
else
    if holds.w[owner] then
        take('w') -- re-entry
        code = 1
    elseif holds.r[owner] then
        code = -2
    elseif next(holds.w) or next(holds.r) then
        if intent > 0 then
            put('wait', owner, 1, now + intent)
        end
        code = 0
    else
        take('w')
        code = 1
    end
    if code == 1 and holds.wait[owner] then
        put('wait', owner, 0, 0)
    end
end
finish()
local wait = 0
if code ~= 1 then
    local soonest
    for _, owners in pairs(holds) do
        for o, h in pairs(owners) do
            if o ~= owner and (soonest == nil or h.exp < soonest) then
                soonest = h.exp
            end
        end
    end
    if soonest then
        wait = soonest - now
    end
end
return { code, total(owner), wait }
