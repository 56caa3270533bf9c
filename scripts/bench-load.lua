-- wrk script for scripts/bench-load.sh: POSTs an AdmissionReview fixture.
--   wrk ... -s scripts/bench-load.lua URL -- FIXTURE MODE [RUN_ID]
-- MODE: as-is    the fixture unchanged (one precomputed request)
--       dry-run  request.dryRun set to true (one precomputed request)
--       durable  a fresh request.uid per request and a /10 allocatable list, so every
--                request is a new allocation that the ledger must make durable; each uid
--                is a UUID, as API servers send, made of a hash of RUN_ID and a count

local prefix, suffix, run_hash
local counter = 0
local headers = { ["Content-Type"] = "application/json" }

local REQUEST_UID = "705ab4f5-6393-11e8-b7cc-42010a800002"

local function replace_once(text, old, new)
  local at = assert(text:find(old, 1, true), "fixture lacks " .. old)
  return text:sub(1, at - 1) .. new .. text:sub(at + #old)
end

function init(args)
  local file = assert(io.open(args[1], "rb"))
  local body = file:read("*a")
  file:close()
  local mode = args[2] or "as-is"
  -- two 32-bit hashes of the run id: runs against one server do not repeat a uid
  local run_id = args[3] or "0"
  local h1, h2 = 0, 0
  for i = 1, #run_id do
    h1 = (h1 * 31 + run_id:byte(i)) % 4294967296
    h2 = (h2 * 37 + run_id:byte(i)) % 4294967296
  end
  run_hash = string.format("%08x-%04x-%04x", h1, math.floor(h2 / 65536), h2 % 65536)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  if mode == "dry-run" then
    body = replace_once(body, '"dryRun": false', '"dryRun": true')
  elseif mode == "durable" then
    body = body:gsub('"ip%-webhook%.io/allocatable%-ips": "[^"]*"',
                     '"ip-webhook.io/allocatable-ips": "10.64.0.0/10"', 1)
    local at = assert(body:find(REQUEST_UID, 1, true), "fixture lacks the request uid")
    prefix = body:sub(1, at - 1)
    suffix = body:sub(at + #REQUEST_UID)
    return
  elseif mode ~= "as-is" then
    error("unknown mode " .. mode)
  end
  wrk.body = body
  request = nil -- static: wrk sends one precomputed request
end

function request()
  counter = counter + 1
  local uid = string.format("%s-0000-%06x%06x", run_hash,
                            math.floor(counter / 16777216), counter % 16777216)
  return wrk.format(nil, nil, headers, prefix .. uid .. suffix)
end
