-- Grow a held reservation with no limit check (the stream is already flowing).
-- Fenced: -1 when the caller's lease is gone (it re-registers what it holds instead).
-- KEYS: used hash, gateway hash, gateway lease. ARGV: tenant, delta, lease epoch
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
local delta = tonumber(ARGV[2])
if delta <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], delta)
redis.call('HINCRBY', KEYS[2], ARGV[1], delta)
return delta
