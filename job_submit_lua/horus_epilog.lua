#!/usr/bin/env lua5.1
--[[
slurm-horus EpilogSlurmctld (Lua 5.1 + lua-socket, what job_submit.lua already needs).

    slurm.conf:  EpilogSlurmctld=/etc/slurm/horus_epilog.lua   (beside job_submit.lua, mode 0755)

Tells horusd that a job ended. horusd frees the job's GPUs in its state, runs its scheduling cycle
and moves the jobs it keeps onto them, then answers; this script waits for that answer. slurmctld
keeps the job COMPLETING (its GPUs held) until this script exits, and starts pending jobs in the pass
that follows the completion: the moved jobs start then, as a job plain Slurm queued would. Without
this script horusd sees the end at its next squeue read (refresh_s, 1-2 s) and the moved job starts
at Slurm's next scheduling pass after that.

It cannot fail a job, and delays its completion by at most timeout_ms: slurmctld runs it as
SlurmUser once per job end. It loads job_submit.lua beside it (the same horus.conf, socket and
timeout_ms), sends one line on horusd's controller socket, waits for the answer within that
deadline, ignores every error, and exits 0. While the kill switch (disable_file) exists it sends
nothing. horusd's `ping` counts the notices (ended_notices).
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
  if line then horus.ask(conf, line) end
end

pcall(notify)
os.exit(0)
