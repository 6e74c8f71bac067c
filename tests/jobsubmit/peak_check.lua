--[[
peak_check.lua JOB_SUBMIT_LUA [FILE] - job_submit.lua's peak(N) of a published
MMGUARD record against the C library's mm_peak_for_dp() of the same record.
Input (FILE or stdin, from tests/jobsubmit/peak_tool): "v=4 ..." record lines,
each followed by "N<TAB>PEAK" lines (PEAK "-": the record does not cover N, and
job_submit.lua must say so, nil).  Prints "N passed, N failed"; exit 1 on
any difference.
--]]
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_error = function() end }
dofile(arg[1])
local M = mmguard_jobsubmit
local pass, fail, model, text = 0, 0, nil, nil
for line in (arg[2] and io.lines(arg[2]) or io.lines()) do
    if line:sub(1, 3) == "v=4" then
        local err
        model, err = M.parse_record(line)
        text = line
        if not model then fail = fail + 1; print("FAIL parse: " .. tostring(err) .. ": " .. line) end
    elseif model then
        local n, want = line:match("^(%d+)\t([%d-]+)$")
        local pk = M.peak_for_dp(model, tonumber(n))
        local got = pk and M.istr(pk) or "-"
        if got == want then pass = pass + 1
        else
            fail = fail + 1
            if fail <= 20 then print(string.format("FAIL N=%s: lua %s, C %s (%s)", n, got, want, text)) end
        end
    end
end
print(string.format("%d passed, %d failed", pass, fail))
os.exit(fail == 0 and pass > 0 and 0 or 1)
