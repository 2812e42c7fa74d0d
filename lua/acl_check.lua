-- Asks the server whether the connection's ACL user may send each command a lock will send,
-- without running any of them (`redis.acl_check_cmd`, Redis 7.0+). Keyless, so it can run on
-- any node; the keys and channels to check are arguments.
-- ARGV   groups of: command name, number of arguments n, then n arguments (keys, channels and
--        values exactly as the lock sends them)
-- Returns the denied ones, each as "COMMAND arg ..." (an empty array when all are allowed);
-- an unknown or renamed command counts as denied, with the server's message.
local denied = {}
local i = 1
while i <= #ARGV do
    local name = ARGV[i]
    local n = tonumber(ARGV[i + 1])
    local args = {}
    for j = 1, n do
        args[j] = ARGV[i + 1 + j]
    end
    local ok, allowed = pcall(redis.acl_check_cmd, name, unpack(args))
    local shown = string.upper(name) .. ' ' .. table.concat(args, ' ')
    if not ok then
        denied[#denied + 1] = shown .. ' (' .. tostring(allowed) .. ')'
    elseif not allowed then
        denied[#denied + 1] = shown
    end
    i = i + 2 + n
end
return denied
