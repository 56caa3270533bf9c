-- wrk script for scripts/bench-load.sh: POSTs an AdmissionReview fixture.
--   wrk ... -s scripts/bench-load.lua URL -- FIXTURE MODE [RUN_ID]
-- MODE: as-is    the fixture unchanged (one precomputed request)
--       dry-run  request.dryRun set to true (one precomputed request)
--       durable  a fresh request.uid per request and a /10 allocatable list, so every
--                request is a new allocation that the ledger must make durable

local prefix, suffix, run_id
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
  run_id = args[3] or "0"
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
  local uid = string.format("bench-%s-%010d", run_id, counter)
  return wrk.format(nil, nil, headers, prefix .. uid .. suffix)
end
