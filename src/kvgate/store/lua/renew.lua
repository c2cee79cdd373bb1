-- Extend this gateway's lease if it is still the one it holds (same epoch token).
-- KEYS: gateway lease, gateways set. ARGV: lease epoch, ttl ms, gateway id.
-- Returns 1, or 0 when the lease is gone (expired and reaped, or the store restarted).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
