--[[
verdict_cards.lua JOB_SUBMIT_LUA CONF RECORD TYPE:N... - job_submit.lua's
verdict of a published record for each GPU type and count, under each
flush= policy: one line per TYPE:N,
  "TYPE N USABLE KIND RETRIES PEAK accept=DECISION warn=DECISION reject=DECISION
   mb_accept=MB mb_warn=MB mb_reject=MB"
where DECISION is what slurmctld decides (M.submit on a job asking for N GPUs
of TYPE on one node; action=reject) and MB the micro-batch its rejection
names ("to fit: training.micro_batch_size=MB", 0 = none).  CONF: mmguard.conf text ("\n" escaped
as "|").  tests/jobsubmit/verdict_check.py compares it with mmguard check.
--]]
local last
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_error = function() end,
          log_user = function(fmt, ...) last = string.format(fmt, ...) end }
dofile(arg[1])
local M = mmguard_jobsubmit
local conf_text = arg[2]:gsub("|", "\n")
local conf_file = os.tmpname()
M.conf_path = function() return conf_file end
local function decision(policy, t, n)
    local f = assert(io.open(conf_file, "w"))
    f:write(conf_text .. "\naction=reject\nflush=" .. policy .. "\n")
    f:close()
    last = nil
    local job = { name = "v", user_name = "u", user_id = 0, min_nodes = 1, max_nodes = 1,
                  time_limit = 1, tres_per_node = "gres:gpu:" .. t .. ":" .. n, ntasks_per_node = 65534,
                  num_tasks = 4294967294, cpus_per_task = 65534, pn_min_cpus = 65534,
                  spank_job_env = { "MMGUARD=" .. arg[3] }, environment = {} }
    local rc = M.submit(job, {}, 0)
    local mb = last and last:match("training%.micro_batch_size=(%d+)") or "0"
    if rc ~= 0 then return "reject", mb end
    return last and last:find("WARNING", 1, true) and "warn" or "accept", mb
end
local conf = assert(M.parse_conf(conf_text, "CONF"))
local m = assert(M.parse_record(arg[3]))
for i = 4, #arg do
    local t, n = arg[i]:match("^(.-):(%d+)$")
    n = tonumber(n)
    local usable = M.usable_bytes(conf.gpus[t], conf)
    local c, why = M.card_at(m, t, n, usable)
    if not c then
        print(t .. " " .. n .. " none " .. why)
    else
        local row, mbs = { t, M.istr(n), M.istr(usable), c.kind, M.istr(c.retries), M.istr(c.peak) }, {}
        for _, policy in ipairs({ "accept", "warn", "reject" }) do
            local d, mb = decision(policy, t, n)
            row[#row + 1] = policy .. "=" .. d
            mbs[#mbs + 1] = "mb_" .. policy .. "=" .. mb
        end
        print(table.concat(row, " ") .. " " .. table.concat(mbs, " "))
    end
end
os.remove(conf_file)
