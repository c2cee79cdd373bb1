-- Atomic check-and-increment of a reservation against limits computed in Python
-- (kvgate.admission.quota); mirrors kvgate.store.check_reserve. Fenced: it only counts
-- under the caller's current lease (KEYS[5] holds the lease's epoch token); otherwise it
-- answers 'lease_lost' and the caller re-registers what it holds before it retries.
-- KEYS: used hash, guaranteed hash, gateway hash, gateways set, gateway lease
-- ARGV: tenant, tokens, total, tenant_cap, guaranteed, elastic_pool, tenant_elastic_limit,
--       gateway id, lease epoch
if redis.call('GET', KEYS[5]) ~= ARGV[9] then return {0, 'lease_lost'} end
local tenant = ARGV[1]
local n = tonumber(ARGV[2])
local total, cap, g = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local pool, share = tonumber(ARGV[6]), tonumber(ARGV[7])

local used = redis.call('HGETALL', KEYS[1])
local gflat = redis.call('HGETALL', KEYS[2])
local gmap = {}
for i = 1, #gflat, 2 do gmap[gflat[i]] = tonumber(gflat[i + 1]) end

local global_used, elastic_used, tenant_used = 0, 0, 0
for i = 1, #used, 2 do
  local u = tonumber(used[i + 1])
  global_used = global_used + u
  local tg = gmap[used[i]] or 0
  if u > tg then elastic_used = elastic_used + (u - tg) end
  if used[i] == tenant then tenant_used = u end
end

if tenant_used + n > cap then return {0, 'tenant_cap'} end
if global_used + n > total then return {0, 'total'} end
local over_before = math.max(0, tenant_used - g)
local over_after = math.max(0, tenant_used + n - g)
local extra = over_after - over_before
local reason = 'within_guarantee'
if extra > 0 then
  if elastic_used + extra > pool then return {0, 'elastic_pool'} end
  if over_after > share then return {0, 'tenant_share'} end
  reason = 'elastic'
end
redis.call('HINCRBY', KEYS[1], tenant, n)
redis.call('HINCRBY', KEYS[3], tenant, n)
redis.call('SADD', KEYS[4], ARGV[8])
return {1, reason}
