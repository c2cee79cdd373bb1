-- Take a new lease (epoch token) and make this gateway's counted reservations exactly
-- what it says it holds: whatever the store still counts for it (a lease that expired
-- but was not reaped yet, writes that failed during an outage) is replaced atomically,
-- so nothing is counted twice and nothing still running is left uncounted.
-- KEYS: used hash, gateway hash, gateways set, gateway lease
-- ARGV: gateway id, ttl ms, new epoch, then tenant, tokens pairs. Returns tokens counted.
local old = redis.call('HGETALL', KEYS[2])
for i = 1, #old, 2 do
  if redis.call('HINCRBY', KEYS[1], old[i], -tonumber(old[i + 1])) <= 0 then
    redis.call('HDEL', KEYS[1], old[i])
  end
end
redis.call('DEL', KEYS[2])
local counted = 0
for i = 4, #ARGV, 2 do
  local n = tonumber(ARGV[i + 1])
  if n > 0 then
    redis.call('HINCRBY', KEYS[1], ARGV[i], n)
    redis.call('HSET', KEYS[2], ARGV[i], n)
    counted = counted + n
  end
end
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
return counted
