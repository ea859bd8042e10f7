-- slurm-horus job_submit.lua (logging only): records every submission in slurmctld.log as a
-- "horus: ..." line and changes nothing. The live-placement version replaces this file; it is
-- Lua 5.1 (what Debian's job_submit_lua.so links) and must never reject a job.

local function field(value)
  if value == nil then return "-" end
  return tostring(value)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  slurm.log_info("horus: submit name=%s uid=%s req_nodes=%s tres_per_node=%s comment=%s",
    field(job_desc.name), field(submit_uid), field(job_desc.req_nodes),
    field(job_desc.tres_per_node), field(job_desc.comment))
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

slurm.log_info("horus: job_submit.lua loaded (logging only)")
return slurm.SUCCESS
