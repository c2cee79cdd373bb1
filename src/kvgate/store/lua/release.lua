-- Return up to `tokens` of what this gateway holds for the tenant (never more, so a
-- Redis that restarted empty, or a lease already reaped, cannot go negative).
-- Fenced: -1 when the caller's lease is gone (its holdings were reaped or lost).
-- KEYS: used hash, gateway hash, gateway lease. ARGV: tenant, tokens, lease epoch
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local amount = math.min(held, tonumber(ARGV[2]))
if amount <= 0 then return 0 end
if redis.call('HINCRBY', KEYS[2], ARGV[1], -amount) <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -amount) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return amount
