--[[
peak_check.lua JOB_SUBMIT_LUA CASES - the Lua peak(N) of contrib/job_submit.lua
against the C library.  CASES: one case a line, "EXPECTED<TAB>N<TAB>MODEL",
EXPECTED being `mmguard predict --json --set training.data_parallel=N`'s
peak_bytes and MODEL the MMGUARD_PEAK_MODEL string of the same spec.
Prints "N passed, N failed"; exit 1 on any mismatch.
--]]
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_error = function() end }
dofile(arg[1])
local M = mmguard_jobsubmit
local pass, fail = 0, 0
for line in io.lines(arg[2]) do
    local want, n, model = line:match("^(%d+)\t(%d+)\t(.+)$")
    local m, err = M.parse_peak_model(model)
    if not m then
        fail = fail + 1; print("FAIL parse: " .. tostring(err) .. ": " .. model)
    else
        local got = M.peak_for_dp(m, tonumber(n))
        if M.istr(got) == want then pass = pass + 1
        else fail = fail + 1; print(string.format("FAIL N=%s: lua %s, C %s (%s)", n, M.istr(got), want, model)) end
    end
end
print(string.format("%d passed, %d failed", pass, fail))
os.exit(fail == 0 and pass > 0 and 0 or 1)
