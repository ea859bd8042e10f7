--[[
slurm-horus job_submit.lua (Lua 5.1, runs inside slurmctld).

For every GPU job it asks the placement service horusd (Unix socket, hard timeout) where the job
should go, and rewrites the job to exactly that node and those GPUs (typed GRES gpu:gK or shard:gK),
appending a `horus:` token to admin_comment. When horusd cannot place the job now it may answer
"keep": the job gets a movable shape (gres:shard:1 or gres:gpu:N) and a begin time a lease ahead,
and horusd starts it later where its scheduling cycle places it; if horusd is gone, the lease runs
out and Slurm starts the job itself. It FAILS OPEN: on any error, timeout, odd reply or unhandled
job kind the job goes through untouched. It never rejects a job for its own reasons.

slurmctld holds its job read lock while this runs and has no timeout of its own, so every socket
operation has a deadline (timeout_ms, default 100 ms). Settings come from the slurm-horus site file
(HORUS_CONFIG or /etc/horus/horus.conf): socket, timeout_ms, disable_file, max_state_age_s,
handle_exclusive, handle_nodelist. While disable_file exists, nothing is asked (kill switch).

Every decision is logged with the greppable prefix "horus:". Each function below has a Python twin
in slurm_horus/service/lua_twin.py, and tests hold the two against each other in real Lua 5.1.
]]

local horus = {}

horus.DEFAULTS = {
  socket = "/run/horus/horusd.sock",
  timeout_ms = 100,
  max_offer_age_s = 3,
  disable_file = "/etc/horus/disabled",
  max_state_age_s = 60,
  handle_exclusive = false,
  handle_nodelist = false,
  offers = true, -- take horusd's published offers (docs/horusd.md)
  breaker_timeouts = 3, -- after this many asks in a row time out, stop asking ...
  breaker_open_s = 5, -- ... for this long, then try one; each failed try doubles it ...
  breaker_max_open_s = 60, -- ... up to this
}

local BOOLEAN_SETTINGS = { handle_exclusive = true, handle_nodelist = true, offers = true }
local NUMBER_SETTINGS = { timeout_ms = true, max_state_age_s = true, max_offer_age_s = true,
  breaker_timeouts = true, breaker_open_s = true, breaker_max_open_s = true }

local function trim(s)
  return (string.gsub(s, "^%s*(.-)%s*$", "%1"))
end

local function to_bool(text)
  local lowered = string.lower(text)
  return lowered == "1" or lowered == "yes" or lowered == "true" or lowered == "on"
end

-- Parse the site file's "name = value" lines; only the settings the Lua needs are kept, the rest
-- (read by horusd) are ignored here. Returns a table with defaults filled in.
function horus.parse_config(text)
  local conf = {}
  for name, value in pairs(horus.DEFAULTS) do conf[name] = value end
  for line in string.gmatch((text or "") .. "\n", "([^\n]*)\n") do
    local stripped = trim((string.gsub(line, "#.*$", "")))
    local key, value = string.match(stripped, "^([%w_%-]+)%s*=%s*(.-)$")
    if key then
      key = string.gsub(string.lower(key), "-", "_")
      if horus.DEFAULTS[key] ~= nil then
        if BOOLEAN_SETTINGS[key] then
          conf[key] = to_bool(value)
        elseif NUMBER_SETTINGS[key] then
          conf[key] = tonumber(value) or horus.DEFAULTS[key]
        else
          conf[key] = value
        end
      end
    end
  end
  return conf
end

local function read_file(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local function file_exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

-- Slurm's "unset" sentinel for 32-bit fields is NO_VAL (0xfffffffe); INFINITE is 0xffffffff.
local function is_set_number(value)
  return type(value) == "number" and value < 4294967294
end

-- Count GPUs in a TRES string such as "gres:gpu:2", "gres/gpu=2", "gres:gpu:v100:2",
-- "gres:gpu:g1:1,gres:gpu:g3:1" or "gpu:2". Returns count, type (nil when untyped or mixed).
function horus.count_gpus(tres)
  if tres == nil or tres == "" then return 0, nil end
  local total, gpu_type, mixed = 0, nil, false
  for item in string.gmatch(tres, "[^,]+") do
    item = string.gsub(trim(item), "^gres[:/]", "")
    local name, rest = string.match(item, "^(%w+)[:=]?(.*)$")
    if name == "gpu" then
      local kind, count = string.match(rest, "^([^:=]+)[:=](%d+)$")
      if not kind then
        count = string.match(rest, "^(%d+)$")
        if not count and rest == "" then count = "1" end
        if not count then kind, count = rest, "1" end
      end
      total = total + (tonumber(count) or 0)
      if kind then
        if gpu_type and gpu_type ~= kind then mixed = true end
        gpu_type = kind
      end
    end
  end
  if mixed then gpu_type = nil end
  return total, gpu_type
end

-- Count untyped shards in a TRES string ("gres:shard:3", "gres/shard=3"); a typed shard
-- ("gres:shard:g2:3") names its GPU already and is not counted.
function horus.count_shards(tres)
  if tres == nil or tres == "" then return 0 end
  local total = 0
  for item in string.gmatch(tres, "[^,]+") do
    item = string.gsub(trim(item), "^gres[:/]", "")
    local name, rest = string.match(item, "^(%w+)[:=]?(.*)$")
    if name == "shard" then
      if rest == "" then
        total = total + 1
      elseif string.match(rest, "^%d+$") then
        total = total + tonumber(rest)
      end
    end
  end
  return total
end

-- What the job asks for, in every form Slurm accepts. Returns nil when the job wants no GPU,
-- else {gpus_per_node=, nodes=, form=, gpu_type=} (and shards= for --gres=shard:N on one node:
-- N shards of one GPU, placed by horusd on one GPU's free shards).
function horus.gpu_request(job)
  local nodes = is_set_number(job.min_nodes) and job.min_nodes or 1
  if nodes < 1 then nodes = 1 end
  local per_node, per_node_type = horus.count_gpus(job.tres_per_node)
  if per_node > 0 then
    return { gpus_per_node = per_node, nodes = nodes, form = "tres_per_node", gpu_type = per_node_type }
  end
  local per_job, per_job_type = horus.count_gpus(job.tres_per_job)
  if per_job > 0 then
    -- --gpus=N without -N: one node; with -N k the GPUs must divide evenly or we leave it.
    if per_job % nodes ~= 0 then return nil, "gpus per job not divisible by nodes" end
    return { gpus_per_node = per_job / nodes, nodes = nodes, form = "tres_per_job", gpu_type = per_job_type }
  end
  local per_task = horus.count_gpus(job.tres_per_task)
  if per_task > 0 then
    local tasks = is_set_number(job.num_tasks) and job.num_tasks or 1
    if tasks % nodes ~= 0 then return nil, "tasks not divisible by nodes" end
    return { gpus_per_node = per_task * tasks / nodes, nodes = nodes, form = "tres_per_task" }
  end
  local shards = horus.count_shards(job.tres_per_node)
  if shards > 0 and nodes == 1 then
    return { gpus_per_node = 1, nodes = 1, form = "tres_per_node", shards = shards }
  end
  return nil
end

-- Should horus decide for this job? Returns true, or false and the reason (logged). Left alone:
-- what horus cannot place right (arrays, heterogeneous jobs, a job waiting on another job or on a
-- begin time or a reservation of its own, a GPU type the user named) and, unless the site says
-- otherwise, explicit nodelists and --exclusive. ``now``: the epoch (os.time()).
function horus.should_handle(job, conf, now)
  local request, why = horus.gpu_request(job)
  if request == nil then return false, why or "no gpu" end
  if job.array_inx ~= nil and job.array_inx ~= "" then return false, "job array" end
  if job.het_job_offset ~= nil and is_set_number(job.het_job_offset) then return false, "heterogeneous job" end
  if job.dependency ~= nil and job.dependency ~= "" then return false, "dependency" end
  if is_set_number(job.begin_time) and job.begin_time > (now or os.time()) then
    return false, "begin time set by the user"
  end
  if job.reservation ~= nil and job.reservation ~= "" then return false, "reservation" end
  if (job.req_nodes ~= nil and job.req_nodes ~= "") and not conf.handle_nodelist then
    return false, "explicit nodelist"
  end
  if job.shared == 0 and not conf.handle_exclusive then return false, "explicit exclusive" end
  if request.gpu_type and string.match(request.gpu_type, "^g%d+$") then
    return false, "already pinned to a gpu index"
  end
  return true, request
end

-- Minimal JSON encoding for the request (strings, numbers, booleans, flat tables of strings).
local function json_value(value)
  local kind = type(value)
  if kind == "number" then
    if value ~= value or value == math.huge or value == -math.huge then return "null" end
    if value == math.floor(value) then return string.format("%d", value) end
    return string.format("%.17g", value)
  elseif kind == "boolean" then
    return value and "true" or "false"
  elseif kind == "table" then
    local keys = {}
    for k in pairs(value) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    local parts = {}
    for _, k in ipairs(keys) do parts[#parts + 1] = json_value(k) .. ":" .. json_value(value[k]) end
    return "{" .. table.concat(parts, ",") .. "}"
  elseif value == nil then
    return "null"
  end
  local escaped = string.gsub(tostring(value), '[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", string.byte(c))
  end)
  return '"' .. escaped .. '"'
end
horus.json_value = json_value

local HINT_NAMES = { "HORUS_CLASS", "HORUS_MODEL", "HORUS_BATCH_SIZE", "HORUS_AMP", "HORUS_EXPECTED_MINUTES",
  "HORUS_OFF" }

-- A batch job's environment as a Lua table ({} for srun/salloc or when unreadable). slurmctld
-- builds the whole table on each access of job.environment, so read it once per submission.
local function job_environment(job)
  local ok, env = pcall(function() return job.environment end)
  if ok and type(env) == "table" then return env end
  return {}
end

local function env_value(env, name)
  local ok, value = pcall(function() return env[name] end)
  if ok and value ~= nil then return tostring(value) end
  return nil
end

-- The job class horusd would read from this job (twin: slurm_horus/jobclass.py job_class_of).
function horus.job_class(env, comment)
  local name = env_value(env, "HORUS_CLASS")
  if not name or name == "" then
    local model = env_value(env, "HORUS_MODEL")
    if model and model ~= "" then
      name = string.lower(model)
      local batch = env_value(env, "HORUS_BATCH_SIZE")
      if batch and batch ~= "" then name = name .. "-bs" .. batch end
    end
  end
  if not name or name == "" then
    for word in string.gmatch(comment or "", "[^%s,;]+") do
      local found = string.match(word, "^horus_class=([%w_%.%-]+)") or string.match(word, "^class=([%w_%.%-]+)")
      if found then name = found break end
    end
  end
  if not name or name == "" or not string.match(name, "^[%w_%.%-]+$") then return "unknown" end
  return name
end

-- The user opted out (horus-sbatch --horus-off, HORUS_OFF=1 in the job's environment, or the word
-- horus=off in --comment): the job goes to Slurm untouched and is never shared
-- (twin: slurm_horus/service/lua_twin.py opted_out; horusd applies the same rule).
function horus.opted_out(env, comment)
  local off = env_value(env, "HORUS_OFF")
  if off and to_bool(trim(off)) then return true end
  for word in string.gmatch(comment or "", "[^%s,;]+") do
    local value = string.match(word, "^horus=(%a+)$")
    if value and (string.lower(value) == "off" or string.lower(value) == "no") then return true end
  end
  return false
end

-- A GPU job left to Slurm (an array, --nodelist, --exclusive, a GPU index of the user's choice,
-- opted out...) may start on a GPU horusd would give the next job before horusd sees it in the
-- queue: horusd is told (no answer awaited) and pins nothing until its next look at the queue.
-- Returns that line, or nil for a job that asks for no GPU (twin: lua_twin.left_message).
function horus.left_message(job, submit_uid, why)
  local gpus = horus.count_gpus(job.tres_per_node) + horus.count_gpus(job.tres_per_job)
    + horus.count_gpus(job.tres_per_task)
  if gpus == 0 then return nil end
  return json_value({ op = "left", uid = submit_uid, user = job.user_name, reason = why })
end

-- A job ended (EpilogSlurmctld, horus_epilog.lua): horusd frees its GPUs and moves the jobs it keeps
-- onto them before it answers. Returns that line, or nil for no job id (twin: lua_twin.ended_message).
function horus.ended_message(job_id)
  local id = tonumber(string.match(tostring(job_id or ""), "^%s*(%d+)%s*$") or "")
  if id == nil or id <= 0 or id >= 4294967296 then return nil end
  return json_value({ op = "ended", job_id = id })
end

-- An offer is where a 1-GPU job of a class would go on any GPU: only a job asking for just that
-- (one GPU on one node, of no particular type, in no particular partition) may take one
-- (twin: lua_twin.offer_fits).
function horus.offer_fits(job, request, conf)
  return conf.offers == true and request.gpus_per_node == 1 and request.nodes == 1 and request.gpu_type == nil
    and request.shards == nil and (job.partition == nil or job.partition == "")
end

-- horusd publishes, beside its socket, where a 1-GPU job of each class would go now:
--   version=N;claimed=ID;generated=EPOCH   (claimed: the last claim horusd had recorded)
--   CLASS<TAB>key=value;... (the reply format)
-- Taking an offer spares the round trip to horusd. Versions only grow. ``spent`` is the newest
-- version this script may no longer take from: the one it took an offer from (two jobs must not get
-- the same GPU from one snapshot), or the one horusd's last reply named (offers computed before that
-- decision do not know it). The claim tells horusd to record the offer taken; until the header
-- shows that claim recorded (``awaiting``: the id of the offer taken last), no offer is taken:
-- one computed before the claim arrived would not know that GPU is taken.
-- Joint offers (the header says ``joint=K``: the first K lines): horusd computed each of them as if
-- the joint offers before it were taken, so any of them may be taken together: from the version it
-- took a joint offer from last (``taken_version``) the script may still take the joint offer of a
-- class it has not taken from it (``taken``: class -> true), without waiting for its claims.
-- Returns the offer (a parsed reply), its version and whether it is joint, or nil and why.
function horus.find_offer(text, job_class, now, conf, spent, awaiting, taken_version, taken)
  if type(text) ~= "string" or text == "" then return nil, "no offers" end
  local header, rest = string.match(text, "^([^\n]*)\n(.*)$")
  if not header then return nil, "no offers" end
  local version = string.match(header, "^version=(%d+);")
  local generated = horus.offers_generated(header)
  if not version or not generated then return nil, "malformed offers" end
  if now - generated > conf.max_offer_age_s then return nil, "stale offers" end
  local joint = tonumber(string.match(header, ";joint=(%d+);") or "0")
  local together = taken_version ~= nil and version == taken_version
  if together then
    if taken and taken[job_class] then return nil, "offer taken" end
  else
    if tonumber(version) <= (spent or 0) then return nil, "offers spent" end
    if awaiting and string.match(header, ";claimed=([%w%-_]*);") ~= awaiting then return nil, "claim not seen yet" end
  end
  local index = 0
  for line in string.gmatch(rest, "[^\n]+") do
    index = index + 1
    local class, kv = string.match(line, "^([^\t]+)\t(.*)$")
    if class == job_class then
      if together and index > joint then return nil, "offer not joint" end
      local reply, why = horus.parse_reply(kv, conf)
      if not reply then return nil, why end
      if reply.action ~= "place" then return nil, "no offer" end
      return reply, version, index <= joint
    end
  end
  return nil, "no offer for " .. job_class
end

-- When this script stops waiting for horusd's answer (wall-clock seconds, as horusd's time.time()):
-- horusd decides nothing for a request it reads later (the job went to Slurm unchanged). nil
-- without lua-socket (then nothing is asked anyway).
function horus.give_up_at(conf)
  local ok, socket = pcall(require, "socket")
  if not ok or type(socket) ~= "table" or type(socket.gettime) ~= "function" then return nil end
  return socket.gettime() + conf.timeout_ms / 1000
end

-- The request line sent to horusd (JSON; reply asked for as key=value, which Lua parses cheaply).
function horus.build_request(job, submit_uid, request, env, give_up_at)
  env = env or job_environment(job)
  local hints = {}
  for _, name in ipairs(HINT_NAMES) do hints[name] = env_value(env, name) end
  local message = {
    op = "place",
    reply = "kv",
    uid = submit_uid,
    user = job.user_name,
    partition = job.partition,
    job_name = job.name,
    comment = job.comment,
    tres_per_node = job.tres_per_node,
    tres_per_job = job.tres_per_job,
    tres_per_task = job.tres_per_task,
    num_nodes = request.nodes,
    gpus_per_node = request.gpus_per_node,
    gpu_type = request.gpu_type,
    shards = request.shards,
    time_limit_min = is_set_number(job.time_limit) and job.time_limit or nil,
    exc_nodes = job.exc_nodes,
    hints = hints,
    -- this script can keep the job for horusd's queue (horus.keep); not a shard:N job, whose
    -- kept shape (gres:shard:1) would change what it asks
    keep = request.shards == nil,
    held = job.priority == 0, -- sbatch -H: it waits for its user, not for GPUs
    give_up_at = give_up_at,
  }
  return json_value(message)
end

-- Parse horusd's key=value reply: "ok=1;action=place;id=h-1;nodes=n3;tres=gres:gpu:g2:1;..."
-- Returns a table, or nil and why. Values may not contain ';'.
function horus.parse_kv(line)
  if type(line) ~= "string" or line == "" then return nil, "empty reply" end
  local reply = {}
  for pair in string.gmatch(line, "[^;]+") do
    local key, value = string.match(pair, "^([%w_]+)=(.*)$")
    if not key then return nil, "malformed reply" end
    reply[key] = value
  end
  if reply.ok ~= "1" then return nil, "not ok: " .. tostring(reply.error) end
  return reply
end

-- The fields that end up in the admin_comment token must be plain words.
local function check_token_fields(reply)
  if not reply.id or not string.match(reply.id, "^[%w%-_]+$") then return "bad id" end
  if reply.class and not string.match(reply.class, "^[%w%-_%.]+$") then return "bad class" end
  if reply.mode and not string.match(reply.mode, "^[%a]+$") then return "bad mode" end
  if reply.slowdown and not string.match(reply.slowdown, "^%d+%.?%d*$") then return "bad slowdown" end
  if reply.gpulist and not string.match(reply.gpulist, "^[%w%-%.:+,]+$") then return "bad gpulist" end
  if reply.micro_batch and not string.match(reply.micro_batch, "^%d+$") then return "bad micro_batch" end
  if reply.grad_accum and not string.match(reply.grad_accum, "^%d+$") then return "bad grad_accum" end
  return nil
end

function horus.parse_reply(line, conf)
  local reply, why = horus.parse_kv(line)
  if not reply then return nil, why end
  if reply.action == "unchanged" then return reply end
  if reply.action == "keep" then return horus.parse_keep(reply) end
  if reply.action ~= "place" then return nil, "unknown action" end
  if not reply.nodes or not string.match(reply.nodes, "^[%w%-%.%[%],]+$") then return nil, "bad nodes" end
  if not reply.tres or not string.match(reply.tres, "^[%w:/=,_%-]+$") then return nil, "bad tres" end
  local bad = check_token_fields(reply)
  if bad then return nil, bad end
  if reply.partition and not string.match(reply.partition, "^[%w%-_]+$") then return nil, "bad partition" end
  local age = string.match(reply.age or "", "^%d+%.?%d*$") and tonumber(reply.age) or nil
  if age == nil or age > conf.max_state_age_s then return nil, "stale state" end
  return reply
end

-- slurmctld hands this script GRES requests in its own spelling: "gres:gpu:1" up to 22.05,
-- "gres/gpu:1" later, and 24.11 refuses the old spelling when a script sets it. The prefix the job's
-- own request uses is the one to write back (nil when the job names none).
function horus.gres_prefix(job)
  for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task" }) do
    local value = job[field]
    if type(value) == "string" then
      local prefix = string.match(value, "^(gres[:/])")
      if prefix then return prefix end
    end
  end
  return nil
end

-- ``tres`` (a comma-separated GRES request) with every item spelled with ``prefix`` (nil: as it is).
function horus.respell_tres(tres, prefix)
  if prefix == nil or type(tres) ~= "string" then return tres end
  local items = {}
  for item in string.gmatch(tres, "[^,]+") do
    local bare = string.gsub(item, "^gres[:/]", "")
    items[#items + 1] = prefix .. bare
  end
  return table.concat(items, ",")
end

-- The job's GPUs become ``tres`` per node, spelled as the job's own request (see gres_prefix); the
-- user's other GPU spellings (--gpus, --gpus-per-task) go.
local function set_tres_per_node(job, tres)
  job.tres_per_node = horus.respell_tres(tres, horus.gres_prefix(job))
  if job.tres_per_job ~= nil and job.tres_per_job ~= "" then job.tres_per_job = "" end
  if job.tres_per_task ~= nil and job.tres_per_task ~= "" then job.tres_per_task = "" end
end

-- Append a token to admin_comment (never overwrite it: jobstats keeps its JS1: summary there).
local function add_token(job, token)
  local previous = job.admin_comment
  if previous ~= nil and previous ~= "" then
    job.admin_comment = previous .. " " .. token
  else
    job.admin_comment = token
  end
  return token
end

-- A "keep" reply: horusd queues the job and will place it itself. The kept shape (``tres``) must be
-- one horusd can move later: an untyped shard (gres:shard:1) or untyped whole GPUs per node
-- (gres:gpu:N), in either spelling (gres: or gres/); the lease (seconds) bounds how long the job
-- waits for horusd: then Slurm starts it.
function horus.parse_keep(reply)
  local bad = check_token_fields(reply)
  if bad then return nil, bad end
  local tres = reply.tres or ""
  if not (string.match(tres, "^gres[:/]shard:1$") or string.match(tres, "^gres[:/]gpu:%d+$")) then
    return nil, "bad kept tres"
  end
  local lease = string.match(reply.lease or "", "^%d+$") and tonumber(reply.lease) or nil
  if lease == nil or lease < 1 or lease > 3600 then return nil, "bad lease" end
  return reply
end

-- Keep the job for horusd: its kept shape, a begin time ``lease`` seconds ahead (Slurm will not
-- start it before; horusd renews the lease while it lives and starts the job where it decides),
-- and the token "horus:<id> mode=kept class=<class>". Returns the token.
function horus.keep(job, reply, now)
  set_tres_per_node(job, reply.tres)
  job.begin_time = (now or os.time()) + tonumber(reply.lease)
  return add_token(job, "horus:" .. reply.id .. " mode=kept class=" .. (reply.class or "unknown"))
end

-- Rewrite the job with the decision: node, typed GRES (in the job's own spelling), partition when
-- lent (DeepBoot), and the admin_comment token (appended, never overwritten: jobstats keeps its
-- JS1: summary there; users cannot set admin_comment, so the token cannot be forged).
-- SJF-BSBF's sub-batching (the pair fits in memory with a smaller per-step batch, gradients
-- accumulated): the job reads HORUS_MICRO_BATCH / HORUS_GRAD_ACCUM from its environment
-- (docs/horus-sbatch.md). job_submit/lua sets a job's environment variable through
-- job_desc.environment (Slurm's _set_job_env_field).
local function set_sub_batching(job, reply)
  if not reply.micro_batch then return end
  local env = job.environment
  if env == nil then return end
  env.HORUS_MICRO_BATCH = reply.micro_batch
  env.HORUS_GRAD_ACCUM = reply.grad_accum or "1"
end

function horus.apply(job, reply)
  job.req_nodes = reply.nodes
  set_tres_per_node(job, reply.tres)
  if reply.partition and reply.partition ~= "" then job.partition = reply.partition end
  set_sub_batching(job, reply)
  return horus.append_token(job, reply)
end

-- horus:<id> mode=.. slowdown=.. class=.. [gpus=node:i+j] [micro_batch=m grad_accum=k]
-- (slurm_horus/tokens.py reads it back)
function horus.append_token(job, reply)
  local token = "horus:" .. reply.id .. " mode=" .. (reply.mode or "exclusive") .. " slowdown="
    .. (reply.slowdown or "1.00") .. " class=" .. (reply.class or "unknown")
  if reply.gpulist and reply.gpulist ~= "" then token = token .. " gpus=" .. reply.gpulist end
  if reply.micro_batch then
    token = token .. " micro_batch=" .. reply.micro_batch .. " grad_accum=" .. (reply.grad_accum or "1")
  end
  return add_token(job, token)
end

-- horus-sbatch decided before submission and put HORUS_DECISION=<id> in the job's environment;
-- horusd confirms the decision is its own (and the submitter's) before the token is recorded, so
-- a user cannot forge one. Returns the reply, or nil and why.
function horus.parse_confirm(line, claimed)
  local reply, why = horus.parse_kv(line)
  if not reply then return nil, why end
  if reply.action ~= "confirm" then return nil, "decision " .. tostring(claimed) .. " not confirmed" end
  if reply.id ~= claimed then return nil, "confirmed another decision" end
  local bad = check_token_fields(reply)
  if bad then return nil, bad end
  return reply
end

-- Ask horusd over its Unix socket; every step bounded by the same deadline. The connection is
-- kept between submissions (slurmctld keeps this script's state), which spares a connect and an
-- accept per job; a kept connection that fails is dropped and one fresh connection is tried
-- within what is left of the deadline.
local kept = nil -- { client = <unix socket>, path = <socket path> }

-- Send one line and, when ``answered``, read the reply line; every step within ``deadline``.
local function exchange(client, line, deadline, socket, answered)
  local remaining = deadline - socket.gettime()
  if remaining <= 0 then return nil, "timeout" end
  client:settimeout(remaining)
  local sent, send_err = client:send(line .. "\n")
  if not sent then return nil, "send: " .. tostring(send_err) end
  if not answered then return true end
  remaining = deadline - socket.gettime()
  if remaining <= 0 then return nil, "timeout" end
  client:settimeout(remaining)
  local reply, receive_err = client:receive("*l")
  if not reply then return nil, "receive: " .. tostring(receive_err) end
  return reply
end

local function over_connection(conf, line, answered)
  local socket_ok, socket = pcall(require, "socket")
  local unix_ok, unix = pcall(require, "socket.unix")
  if not (socket_ok and unix_ok) then return nil, "lua-socket not installed" end
  local deadline = socket.gettime() + conf.timeout_ms / 1000
  if kept and kept.path == conf.socket then
    local result, kept_err = exchange(kept.client, line, deadline, socket, answered)
    if result then return result end
    -- horusd restarted, dropped an idle connection, or hangs: never reuse a connection that may
    -- still deliver a late answer; try one fresh connection if time is left
    kept.client:close()
    kept = nil
    if socket.gettime() >= deadline then return nil, kept_err end
  end
  if kept then kept.client:close() kept = nil end
  local client = unix()
  client:settimeout(conf.timeout_ms / 1000)
  local ok, err = client:connect(conf.socket)
  if not ok then client:close() return nil, "connect " .. conf.socket .. ": " .. tostring(err) end
  local result, exchange_err = exchange(client, line, deadline, socket, answered)
  if not result then client:close() return nil, exchange_err end
  kept = { client = client, path = conf.socket }
  return result
end

-- The circuit breaker. A hung horusd costs every submission the whole deadline while slurmctld
-- holds its job lock; after breaker_timeouts asks in a row timed out, nothing is asked for
-- breaker_open_s seconds (jobs go through unchanged), then one ask tries again: an answer closes
-- the breaker, another timeout opens it for twice as long (up to breaker_max_open_s). Errors that
-- cost no time (no socket, connection refused) do not count. ``breaker`` is {timeouts, open_s,
-- until_s, asked_at}. The try is made only while horusd shows signs of life: ``heartbeat`` is the
-- time its offers header was written (horusd rewrites it every second; nil when there is no such
-- file, and then the try is made); a stale one means horusd is stopped or hung, and the try would
-- only cost the deadline again, so it waits, but never longer than breaker_max_open_s since the
-- last ask. A horusd that comes back is asked within a second of its next heartbeat.
function horus.breaker_allows(breaker, now, heartbeat, conf)
  if breaker.until_s == nil then return true end
  if now < breaker.until_s then return false, "circuit open" end
  if heartbeat ~= nil and conf ~= nil and now - heartbeat > conf.max_offer_age_s
      and now - (breaker.asked_at or 0) < conf.breaker_max_open_s then
    return false, "circuit open: horusd silent"
  end
  return true
end

-- When horusd last wrote its offers file (its header's generated=), or nil.
function horus.offers_generated(text)
  if type(text) ~= "string" then return nil end
  return tonumber(string.match(string.match(text, "^[^\n]*"), ";generated=(%d+%.?%d*)$") or "")
end

function horus.is_timeout(err)
  return type(err) == "string" and string.find(err, "timeout", 1, true) ~= nil
end

function horus.breaker_after(breaker, timed_out, now, conf)
  if not timed_out then
    breaker.timeouts, breaker.open_s, breaker.until_s = 0, nil, nil
    return breaker
  end
  breaker.timeouts = (breaker.timeouts or 0) + 1
  if breaker.until_s ~= nil then -- the try after an open period failed too
    breaker.open_s = math.min(2 * breaker.open_s, conf.breaker_max_open_s)
    breaker.until_s = now + breaker.open_s
  elseif breaker.timeouts >= conf.breaker_timeouts then
    breaker.open_s = conf.breaker_open_s
    breaker.until_s = now + breaker.open_s
  end
  return breaker
end

local breaker = { timeouts = 0 } -- slurmctld keeps this script's state between submissions

local function clock()
  local ok, socket = pcall(require, "socket")
  if ok and socket.gettime then return socket.gettime() end
  return os.time()
end

-- Ask horusd and return its reply line (or nil and why), unless the breaker is open.
function horus.ask(conf, line)
  local now, heartbeat = clock(), nil
  if breaker.until_s ~= nil and now >= breaker.until_s then -- half open: is horusd alive?
    heartbeat = horus.offers_generated(read_file(conf.socket .. ".offers"))
  end
  local allowed, why = horus.breaker_allows(breaker, now, heartbeat, conf)
  if not allowed then return nil, why end
  breaker.asked_at = now
  local reply, err = over_connection(conf, line, true)
  horus.breaker_after(breaker, reply == nil and horus.is_timeout(err), clock(), conf)
  return reply, err
end

-- Send one line that horusd does not answer (a claim), on the same kept connection.
function horus.tell(conf, line)
  return over_connection(conf, line, false)
end

-- The directory this script was loaded from (slurmctld loads it beside slurm.conf).
local SCRIPT_DIR = (function()
  if type(debug) ~= "table" or type(debug.getinfo) ~= "function" then return nil end
  local info = debug.getinfo(1, "S") -- level 1: this function, defined in the script's own chunk
  if info and type(info.source) == "string" and string.sub(info.source, 1, 1) == "@" then
    return string.match(string.sub(info.source, 2), "^(.*)/[^/]*$")
  end
  return nil
end)()

-- The site file: HORUS_CONFIG (slurmctld's environment), else horus.conf beside this script, else
-- /etc/horus/horus.conf. No file at all means the defaults.
function horus.config_path()
  local from_env = os.getenv("HORUS_CONFIG")
  if from_env and from_env ~= "" then return from_env end
  if SCRIPT_DIR and file_exists(SCRIPT_DIR .. "/horus.conf") then return SCRIPT_DIR .. "/horus.conf" end
  return "/etc/horus/horus.conf"
end

-- The site file and the kill switch are re-read at most once a second (a burst of submissions
-- reads them once); a change takes effect within a second.
local cached_conf, cached_disabled, cached_at = nil, false, nil

function horus.load_config()
  local now = os.time()
  if cached_conf == nil or cached_at ~= now then
    cached_conf = horus.parse_config(read_file(horus.config_path()))
    cached_disabled = file_exists(cached_conf.disable_file)
    cached_at = now
  end
  return cached_conf, cached_disabled
end

-- Offers of this version or older are spent for this script (see find_offer). On a (re)load, the
-- offers already published may have been taken by the script this one replaces.
local spent_offers = 0
pcall(function()
  local text = read_file(horus.load_config().socket .. ".offers")
  spent_offers = tonumber(string.match(text or "", "^version=(%d+);") or "") or 0
end)

local awaiting_claim = nil -- the offer this script took last, until horusd shows the claim recorded
local taken_version, taken_classes = nil, {} -- the version it took from last, and the classes taken from it

-- horusd's replies name the newest offers version when they were sent: offers up to it are spent.
-- A reply also means horusd read the claim sent before the request on the same connection.
function horus.note_offers_version(reply)
  local version = reply and tonumber(reply.offers_version or "")
  if version and version > spent_offers then spent_offers = version end
  awaiting_claim = nil
  taken_version, taken_classes = nil, {} -- offers computed before this decision do not know it
end

function horus.take_offer(job, submit_uid, env, conf)
  local socket_ok, socket = pcall(require, "socket")
  if not socket_ok then return nil end
  local job_class = horus.job_class(env, job.comment)
  local offer, version, joint = horus.find_offer(read_file(conf.socket .. ".offers"), job_class, socket.gettime(),
    conf, spent_offers, awaiting_claim, taken_version, taken_classes)
  if not offer then return nil end
  if not joint then
    taken_version, taken_classes = nil, {} -- computed on the state alone: nothing more from this version
  elseif version ~= taken_version then
    taken_version, taken_classes = version, {}
  end
  if joint then taken_classes[job_class] = true end
  spent_offers = tonumber(version)
  awaiting_claim = offer.id
  local token = horus.apply(job, offer)
  horus.tell(conf, json_value({ op = "claim", id = offer.id, uid = submit_uid, user = job.user_name }))
  return "placed " .. token .. " nodes=" .. offer.nodes .. " tres=" .. offer.tres .. " (offer " .. version .. ")"
end

-- Leave the job to Slurm: tell horusd when it holds GPUs (see left_message). Returns the log outcome.
function horus.leave(conf, job, submit_uid, why)
  local line = horus.left_message(job, submit_uid, why)
  if line then horus.tell(conf, line) end
  return "skip: " .. why
end

-- One submission, start to end. Returns a short outcome string for the log.
function horus.submit(job, submit_uid)
  local conf, disabled = horus.load_config()
  if disabled then return "skip: disabled by " .. conf.disable_file end
  local env = job_environment(job)
  if horus.opted_out(env, job.comment) then return horus.leave(conf, job, submit_uid, "opted out (horus off)") end
  local claimed = env_value(env, "HORUS_DECISION")
  if claimed then
    if not string.match(claimed, "^[%w%-_]+$") then return "skip: malformed HORUS_DECISION" end
    local raw, err = horus.ask(conf, json_value({ op = "confirm", reply = "kv", id = claimed, uid = submit_uid,
      give_up_at = horus.give_up_at(conf) }))
    if not raw then return "unchanged: horusd " .. tostring(err) end
    local reply, why = horus.parse_confirm(raw, claimed)
    if not reply then return "unchanged: " .. tostring(why) end
    return "confirmed " .. horus.append_token(job, reply)
  end
  local handle, request = horus.should_handle(job, conf)
  if not handle then return horus.leave(conf, job, submit_uid, tostring(request)) end
  if horus.offer_fits(job, request, conf) then
    local offered = horus.take_offer(job, submit_uid, env, conf)
    if offered then return offered end
  end
  taken_version, taken_classes = nil, {} -- horusd decides this one: joint offers do not know it
  local line = horus.build_request(job, submit_uid, request, env, horus.give_up_at(conf))
  local raw, ask_err = horus.ask(conf, line)
  if not raw then return "unchanged: horusd " .. tostring(ask_err) end
  local reply, parse_err = horus.parse_reply(raw, conf)
  if not reply then return "unchanged: " .. tostring(parse_err) end
  horus.note_offers_version(reply)
  if reply.action == "unchanged" then return "unchanged: " .. tostring(reply.reason or "horusd left it to slurm") end
  if reply.action == "keep" then
    return "kept " .. horus.keep(job, reply) .. " tres=" .. reply.tres .. " lease=" .. reply.lease .. "s"
  end
  local token = horus.apply(job, reply)
  return "placed " .. token .. " nodes=" .. reply.nodes .. " tres=" .. reply.tres
end

local function log(fmt, ...)
  if slurm and slurm.log_info then slurm.log_info(fmt, ...) end
end

local function now_ms()
  return clock() * 1000
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local started = now_ms()
  local ok, outcome = pcall(horus.submit, job_desc, submit_uid)
  if ok then
    log("horus: job name=%s uid=%s %s (%.2f ms)", tostring(job_desc.name), tostring(submit_uid), tostring(outcome),
      now_ms() - started)
  else
    log("horus: error (job left unchanged): %s", tostring(outcome))
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

HORUS = horus -- exposed for the Lua/Python twin tests; slurmctld ignores it
log("horus: job_submit.lua loaded")
return slurm.SUCCESS
