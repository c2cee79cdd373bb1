-- Grow a held reservation with no limit check (the stream is already flowing).
-- KEYS: used hash, gateway hash, gateways set, gateway lease. ARGV: tenant, delta, gateway id, ttl ms
local delta = tonumber(ARGV[2])
if delta <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], delta)
redis.call('HINCRBY', KEYS[2], ARGV[1], delta)
redis.call('SADD', KEYS[3], ARGV[3])
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[4])
end
return delta
