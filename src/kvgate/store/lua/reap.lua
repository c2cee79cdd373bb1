-- Return the reservations of every gateway whose lease key has expired.
-- KEYS: gateways set, used hash. ARGV: key prefix ("kvgate:quota:")
local reclaimed = 0
for _, gid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. 'lease:' .. gid) == 0 then
    local gw = ARGV[1] .. 'gw:' .. gid
    local held = redis.call('HGETALL', gw)
    for i = 1, #held, 2 do
      local n = tonumber(held[i + 1])
      reclaimed = reclaimed + n
      if redis.call('HINCRBY', KEYS[2], held[i], -n) <= 0 then
        redis.call('HDEL', KEYS[2], held[i])
      end
    end
    redis.call('DEL', gw)
    redis.call('SREM', KEYS[1], gid)
  end
end
return reclaimed
