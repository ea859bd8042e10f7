#!/usr/bin/env lua5.1
--[[
slurm-horus EpilogSlurmctld (Lua 5.1 + lua-socket, what job_submit.lua already needs).

    slurm.conf:  EpilogSlurmctld=/etc/slurm/horus_epilog.lua   (beside job_submit.lua, mode 0755)

Tells horusd that a job ended, so that it reads the queue at once and its scheduling cycle places the
jobs it keeps on the GPUs that job freed, instead of at its next periodic read (refresh_s, 1-2 s).
Without it horusd still sees every end at that next read: this is only the wake-up.

It cannot fail or slow a job: slurmctld runs it as SlurmUser once per job end, and keeps the job
COMPLETING (its resources held) until it exits. So it loads job_submit.lua beside it (the same
horus.conf, socket and timeout_ms), sends one line on horusd's controller socket within that
deadline without waiting for an answer, ignores every error, and exits 0. While the kill switch
(disable_file) exists it sends nothing. horusd answers nothing; `horus ping` counts the notices
(ended_notices).
]]

local function notify()
  local here = string.match((arg and arg[0]) or "", "^(.*)/[^/]*$") or "."
  -- job_submit.lua expects slurmctld's table; outside slurmctld only these are read
  slurm = slurm or { SUCCESS = 0, ERROR = -1, log_info = function() end, log_debug = function() end,
                     log_user = function() end, log_error = function() end }
  dofile(here .. "/job_submit.lua")
  local horus = HORUS
  local conf, disabled = horus.load_config()
  if disabled then return end
  local line = horus.ended_message(os.getenv("SLURM_JOB_ID"))
  if line then horus.tell(conf, line) end
end

pcall(notify)
os.exit(0)
