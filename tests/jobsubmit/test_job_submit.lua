--[[
tests/jobsubmit/test_job_submit.lua - unit tests of contrib/job_submit.lua without Slurm.

Run: lua5.3 tests/jobsubmit/test_job_submit.lua [path/to/job_submit.lua] [log-out]
A mock `slurm` table stands in for slurmctld's; job_desc is a plain table (the
22.05 field names).  The decision log of every case is appended to LOG-OUT
(default: a temp file) so that the make rule can validate it with python3 json.
Exit status 0 when every case passes; prints "N passed, N failed".
--]]

local script = arg[1] or "contrib/job_submit.lua"
local logout = arg[2] or os.tmpname()
if logout:sub(1, 1) ~= "/" then logout = (os.getenv("PWD") or ".") .. "/" .. logout end  -- ctld_log must be absolute

local user_msgs, errors, infos = {}, {}, {}
slurm = {
    SUCCESS = 0, ERROR = -1, FAILURE = -1, NO_VAL = 4294967294,
    log_user = function(fmt, ...) user_msgs[#user_msgs + 1] = string.format(fmt, ...) end,
    log_error = function(fmt, ...) errors[#errors + 1] = string.format(fmt, ...) end,
    log_info = function(fmt, ...) infos[#infos + 1] = string.format(fmt, ...) end,
}

dofile(script)
local M = assert(mmguard_jobsubmit, "script must export mmguard_jobsubmit")
assert(type(slurm_job_submit) == "function" and type(slurm_job_modify) == "function")

local MiB = 1024 * 1024
local GiB = 1024 * MiB
local conf_file = os.tmpname()
M.conf_path = function() return conf_file end

local function write_conf(text)
    local f = assert(io.open(conf_file, "w"))
    f:write(text, "\nctld_log=", logout, "\n")
    f:close()
end

local function log_lines()
    local t = {}
    local f = io.open(logout, "r")
    if not f then return t end
    for l in f:lines() do t[#t + 1] = l end
    f:close()
    return t
end

-- 10 GiB replicated + 120 GiB sharded, afrac 0.05, afix 512 MiB, ctx 1 GiB, nccl 1 GiB:
-- peak(1)=138 GiB, peak(2)=76 GiB, peak(3)=55 GiB, peak(4)=44.5 GiB, peak(8)=28.75 GiB.
-- h100 usable (10% margin, 2 GiB reserve) = 69.68 GiB; h200 = 124.4 GiB.
local MODEL = string.format("v1 ctx=%d nccl=%d afix=%d afrac=0.05 terms=%d:%d,%d:%d",
    GiB, GiB, 512 * MiB, 10 * GiB, 120 * GiB, 20 * GiB, 0)
local HUGE = string.format("v1 ctx=%d nccl=%d afix=0 afrac=0 terms=%d:%d", GiB, GiB, 500 * GiB, 10 * GiB)

local function job(opts)
    opts = opts or {}
    local spank = nil
    if opts.mm ~= false then
        spank = {
            [0] = "MMGUARD_PEAK_MODEL=" .. (opts.model or MODEL),
            "MMGUARD_PEAK_BYTES=1234",
            "MMGUARD_SPEC=/home/alice/llava \"quoted\".yaml",
            "MMGUARD_SPEC_SHA256=" .. string.rep("ab", 32),
            "MMGUARD_MODEL=llava-1.5-7b-finetune",
            "MMGUARD_MAX_MICRO_BATCH=4",
            "OTHER_PLUGIN=x=y",
        }
    end
    local j = {
        name = opts.name or "train", user_name = "alice", user_id = 1000.0,
        min_nodes = opts.nodes or 4294967294.0, time_limit = opts.time_limit or 120.0,
        tres_per_node = opts.tpn, tres_per_job = opts.tpj,
        ntasks_per_node = opts.ntasks_per_node or 65534.0, num_tasks = opts.num_tasks or 4294967294.0,
        spank_job_env = spank,
        environment = opts.env or { PATH = "/usr/bin" },
        admin_comment = opts.admin_comment,
    }
    return j
end

local passed, failed = 0, 0
local function case(name, fn)
    user_msgs, errors, infos = {}, {}, {}
    local ok, err = pcall(fn)
    if ok then passed = passed + 1; print("ok   " .. name)
    else failed = failed + 1; print("FAIL " .. name .. ": " .. tostring(err)) end
end
local function eq(a, b, what)
    if a ~= b then error(string.format("%s: expected %s, got %s", what or "value", tostring(b), tostring(a)), 2) end
end
local function has(s, pat, what)
    if type(s) ~= "string" or not s:find(pat, 1, true) then
        error(string.format("%s: '%s' not found in %s", what or "text", pat, tostring(s)), 2)
    end
end
local function last_log()
    local l = log_lines()
    return l[#l]
end
-- decision field of the last log line (the full validation is python's json in the make rule)
local function last_decision()
    local l = last_log() or ""
    return l:match('"decision":"(%a+)"')
end

local BASE = "margin=10%\nreserve=2GiB\ndefault_gpu=h100\n"

-- arithmetic --------------------------------------------------------------

case("peak model arithmetic", function()
    local m = assert(M.parse_peak_model(MODEL))
    -- +1: the double 0.05 is slightly above 1/20, the slack is rounded up
    eq(M.peak_for_dp(m, 1), 138 * GiB + 1, "peak(1)")
    eq(M.peak_for_dp(m, 2), 76 * GiB + 1, "peak(2)")
    eq(M.peak_for_dp(m, 3), 55 * GiB + 1, "peak(3)")
    eq(M.peak_for_dp(m, 4), 44 * GiB + 512 * MiB + 1, "peak(4)")
    -- ceil of the sharded part and of the allocator slack
    local m2 = assert(M.parse_peak_model("v1 ctx=0 nccl=7 afix=0 afrac=0.5 terms=0:3,2:0"))
    eq(M.peak_for_dp(m2, 1), 5, "3*1.5 -> ceil 5")
    eq(M.peak_for_dp(m2, 2), 3 + 7, "max(ceil(3/2)=2, 2)=2 -> 3 (+nccl)")
    eq(M.peak_for_dp(m2, 4), 3 + 7, "max(1, 2)")
    -- the allocator slack is the ceiling of the exact product (0.05 is not exact in binary)
    eq(M.ceil_mul(100, 0.05), 6, "100 * 0.05000000000000000277 -> 6")
    eq(M.ceil_mul(100, 0.5), 50, "exact product stays")
    eq(M.ceil_mul(3, 0.1), 1, "0.3 -> 1")
    eq(M.ceil_mul(0, 0.05), 0, "zero")
    -- dp1: the published allocated peak at N = 1
    local m3 = assert(M.parse_peak_model("v1 ctx=0 nccl=7 afix=0 afrac=0 dp1=4 terms=0:10"))
    eq(M.peak_for_dp(m3, 1), 4, "dp1 at N=1")
    eq(M.peak_for_dp(m3, 2), 5 + 7, "terms at N=2")
end)

case("peak model malformed", function()
    for _, bad in ipairs({ "", "v2 ctx=1 nccl=1 afix=1 afrac=0 terms=1:1", "v1 ctx=1 nccl=1 afix=1 afrac=0",
        "v1 ctx=-1 nccl=1 afix=1 afrac=0 terms=1:1", "v1 ctx=1 nccl=1 afix=1 afrac=x terms=1:1",
        "v1 ctx=1 nccl=1 afix=1 afrac=0 terms=1:1,", "v1 ctx=1 ctx=1 nccl=1 afix=1 afrac=0 terms=1:1",
        "v1 ctx=99999999999999999999 nccl=1 afix=1 afrac=0 terms=1:1",
        "v1 ctx=1 nccl=1 afix=1 afrac=0 terms=1:1 zzz=3" }) do
        local m = M.parse_peak_model(bad)
        eq(m, nil, "parse of '" .. bad .. "'")
    end
end)

case("sizes and margin", function()
    eq(M.parse_size("81559MiB"), 81559 * MiB, "MiB")
    eq(M.parse_size("80gb"), 80000000000, "GB decimal")
    eq(M.parse_size("2 GiB"), 2 * GiB, "space")
    eq(M.parse_size("1.5GiB"), 3 * GiB / 2, "decimal mantissa")
    eq(M.parse_size("79.6543217GiB"), 85528175920, "6 fraction digits, truncated")
    eq(M.parse_size("123"), 123, "bytes")
    eq(M.parse_size("12B"), 12, "B")
    eq(M.parse_size("1.5"), 1, "1.5 bytes floors")
    eq(M.parse_size("GiB"), nil, "no number")
    eq(M.parse_size("5 XB"), nil, "bad unit")
    eq(M.parse_size("99999999999TiB"), nil, "overflow")
    eq(M.parse_size("9007199254740993"), nil, "over 2^53")
    local mg = assert(M.parse_margin("10%"))
    eq(mg.percent, 10, "pct")
    eq(M.parse_margin("101%"), nil, "pct > 100")
    eq(M.format_bytes(math.floor(71.3 * GiB)), "71.3 GiB", "format")
    eq(M.json_double(5), "5.0"); eq(M.json_double(2.5), "2.5"); eq(M.json_double(0.1), "0.1")
    eq(M.format_bytes(12), "12 B", "format B")
end)

case("tres parsing", function()
    local t = assert(M.parse_tres("gres:gpu:h100:2,gres:shard:1"))
    eq(t[1].type, "h100"); eq(t[1].count, 2); eq(t[2].text, "gres:shard:1")
    t = assert(M.parse_tres("gres:gpu:4")); eq(t[1].type, nil); eq(t[1].count, 4)
    t = assert(M.parse_tres("gres:gpu")); eq(t[1].count, 1)
    t = assert(M.parse_tres("gres/gpu:a100-40g")); eq(t[1].type, "a100-40g"); eq(t[1].count, 1)
    eq(M.format_tres(assert(M.parse_tres("gres:gpu:h100:2,gres:shard:1"))), "gres:gpu:h100:2,gres:shard:1")
    eq(M.parse_tres("gres:gpu:h100:x"), nil, "bad count")
end)

case("json escaping", function()
    eq(M.json_string('a"b\\c\n\t\1'), '"a\\"b\\\\c\\n\\t\\u0001"')
    eq(M.json_string("caf\195\169"), '"caf\195\169"', "valid utf-8 kept")
    eq(M.json_string("x\255y"), '"x\239\191\189y"', "invalid byte replaced")
    eq(M.json_string("\237\160\128"), '"\239\191\189\239\191\189\239\191\189"', "surrogate replaced")
    eq(M.json_object({ { "a", 1 }, { "b", nil }, { "c", 0.5 }, { "d", 2.0 }, { "e", true } }),
        '{"a":1,"b":null,"c":0.5,"d":2,"e":true}')
end)

case("conf parsing", function()
    local c, errs = M.parse_conf("# c\naction = resize\nmargin=5%\nreserve=1GiB\ngpu.b200=180GB\n" ..
        "resize_types=h200,b200\nmax_gpus_per_node=4\non_error=allow\nsyslog=no\nlog=/x\n")
    eq(#errs, 0, "errors: " .. table.concat(errs, ";"))
    eq(c.action, "resize"); eq(c.margin.percent, 5); eq(c.reserve, GiB); eq(c.gpus.b200, 180000000000)
    eq(c.resize_types[2], "b200"); eq(c.max_gpus_per_node, 4); eq(c.on_error, "allow")
    eq(c.gpus.h100, 81559 * MiB, "built-in")
    local _, e2 = M.parse_conf("bogus=1\naction=maybe\nresize_types=nosuch\nmargin=100%\nlog=relative\nresize_types=h200,,a100\n")
    eq(#e2, 6, "six errors: " .. table.concat(e2, ";"))
end)

-- decisions -----------------------------------------------------------------

case("no MMGUARD vars: untouched, no log", function()
    write_conf(BASE .. "action=resize\n")
    local before = #log_lines()
    local j = job({ mm = false, tpn = "gres:gpu:h100:1" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:1", "tres")
    eq(j.admin_comment, nil, "comment")
    eq(#log_lines(), before, "no log line")
    local j2 = job({ mm = false }); j2.spank_job_env = { [0] = "FOO=1" }
    eq(slurm_job_submit(j2, {}, 1000), slurm.SUCCESS, "rc other spank vars")
    eq(#user_msgs, 0, "no user message")
end)

case("fits: accepted untouched", function()
    write_conf(BASE .. "action=resize\n")
    local j = job({ tpn = "gres:gpu:h100:4" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:4", "tres")
    eq(j.admin_comment, nil, "comment")
    eq(last_decision(), "accept", "decision")
    eq(#user_msgs, 0, "silent")
end)

case("MMGUARD_ALLOC_DP1_BYTES is the allocated peak at N=1", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:1" })
    -- terms at N=1 give 138 GiB (reject); the published N=1 allocation of 60 GiB fits
    j.spank_job_env[7] = "MMGUARD_ALLOC_DP1_BYTES=" .. string.format("%.0f", 60 * GiB)
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    has(last_log(), '"peak_bytes":' .. string.format("%.0f", 63 * GiB + 512 * MiB + 1024 * MiB + 1), "peak from dp1")
    local j2 = job({ tpn = "gres:gpu:h100:1" })
    j2.spank_job_env[7] = "MMGUARD_ALLOC_DP1_BYTES=lots"
    eq(slurm_job_submit(j2, {}, 1000), slurm.ERROR, "malformed -> on_error=reject")
end)

case("reject", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:2" })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:2", "tres untouched")
    has(user_msgs[1], "job rejected", "user msg")
    has(user_msgs[1], "76.0 GiB", "peak in msg")
    has(user_msgs[1], "largest micro-batch that fits: 4", "hint")
    eq(last_decision(), "reject", "decision")
    has(last_log(), '"time_limit_minutes":120', "time limit")
    has(last_log(), '"gpus":2', "gpus")
end)

case("warn: accepted with a warning", function()
    write_conf(BASE .. "action=warn\n")
    local j = job({ tpn = "gres:gpu:h100:2" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:2", "untouched")
    has(user_msgs[1], "WARNING", "warning")
    eq(last_decision(), "warn", "decision")
end)

case("resize: more GPUs of the same type", function()
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=8\nresize_types=h200\n")
    local env = { SLURM_GPUS_PER_NODE = "h100:2", SBATCH_GRES = "gpu:h100:2" }
    local j = job({ tpn = "gres:gpu:h100:2,gres:shard:1", env = env, ntasks_per_node = 2.0 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:3,gres:shard:1", "tres")
    eq(j.admin_comment, "mmguard: resized gpu:h100:2 -> gpu:h100:3, predicted 55.0 GiB/GPU", "comment")
    eq(env.SLURM_GPUS_PER_NODE, "h100:3", "env")
    eq(env.SBATCH_GRES, "gpu:h100:3", "env gres")
    eq(j.ntasks_per_node, 3, "one task per GPU kept")
    has(user_msgs[1], "resized to gpu:h100:3", "user msg")
    eq(last_decision(), "resize", "decision")
    has(last_log(), '"new_tres":"gres:gpu:h100:3,gres:shard:1"', "log new tres")
end)

case("resize: untyped request uses default_gpu, keeps untyped form", function()
    write_conf(BASE .. "action=resize\n")
    local env = { SLURM_GPUS_PER_NODE = "2" }
    local j = job({ tpn = "gres:gpu:2", env = env, admin_comment = "prior" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:3", "tres")
    eq(env.SLURM_GPUS_PER_NODE, "3", "env")
    has(j.admin_comment, "prior; mmguard: resized gpu:2 -> gpu:3", "comment appended")
end)

case("resize: type switch when the per-node maximum is reached", function()
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=2\nresize_types=a100,h200\n")
    local j = job({ tpn = "gres:gpu:h100:1" })
    -- N=1: 138 GiB; h100 x2: 76 > 69.7; a100 (80 GiB) x2: 76 > 70 GiB usable; h200 x1: 138 > 124.4; h200 x2 fits
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h200:2", "tres")
    has(j.admin_comment, "resized gpu:h100:1 -> gpu:h200:2", "comment")
    has(last_log(), '"new_gpu":"h200"', "log")
end)

case("resize: per-node maximum respected with several nodes", function()
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=2\n")
    local j = job({ tpn = "gres:gpu:h100:1", nodes = 2.0 })   -- N=2 does not fit, N=4 does
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:2", "2 per node on 2 nodes")
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=2\n")
    local j2 = job({ tpn = "gres:gpu:h100:1" })               -- would need 3 on one node
    eq(slurm_job_submit(j2, {}, 1000), slurm.ERROR, "rc")
    eq(j2.tres_per_node, "gres:gpu:h100:1", "untouched")
    has(user_msgs[#user_msgs], "no resize fits (up to 2 GPUs/node", "msg")
end)

case("resize: --gpus (tres_per_job)", function()
    write_conf(BASE .. "action=resize\n")
    local env = { SLURM_GPUS = "2" }
    local j = job({ tpj = "gres:gpu:2", env = env, num_tasks = 2.0 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_job, "gres:gpu:3", "tres per job")
    eq(j.tres_per_node, nil, "no per-node request added")
    eq(env.SLURM_GPUS, "3", "env")
    eq(j.num_tasks, 3, "tasks follow")
end)

case("nothing fits: reject", function()
    write_conf(BASE .. "action=resize\nresize_types=h200\n")
    local j = job({ tpn = "gres:gpu:h100:1", model = HUGE })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:1", "untouched")
    eq(j.admin_comment, nil, "no comment")
    has(user_msgs[1], "no resize fits", "msg")
    eq(last_decision(), "reject", "decision")
end)

case("malformed value: on_error=allow accepts, on_error=reject rejects", function()
    write_conf(BASE .. "action=resize\non_error=allow\n")
    local j = job({ tpn = "gres:gpu:h100:1", model = "v1 ctx=12 garbage" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "allow")
    eq(j.tres_per_node, "gres:gpu:h100:1", "untouched")
    eq(last_decision(), "error", "decision")
    has(errors[1], "MMGUARD_PEAK_MODEL", "logged")
    write_conf(BASE .. "action=resize\non_error=reject\n")
    local j2 = job({ tpn = "gres:gpu:h100:1", model = "v1 ctx=12 garbage" })
    eq(slurm_job_submit(j2, {}, 1000), slurm.ERROR, "reject")
    has(user_msgs[#user_msgs], "MMGUARD_PEAK_MODEL", "user told")
end)

case("bad configuration: on_error applies", function()
    write_conf(BASE .. "action=resize\nfrobnicate=yes\non_error=allow\n")
    local j = job({ tpn = "gres:gpu:h100:1" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "allow")
    eq(j.tres_per_node, "gres:gpu:h100:1", "untouched")
    has(last_log(), "unknown key 'frobnicate'", "reason")
    write_conf(BASE .. "frobnicate=yes\n")   -- on_error defaults to reject
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:1" }), {}, 1000), slurm.ERROR, "reject")
end)

case("no GPU requested: accepted unchanged with a warning; unknown type: on_error", function()
    write_conf(BASE .. "action=resize\non_error=reject\n")
    local j = job({})
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "no gpu")
    eq(j.tres_per_node, nil, "no GPU added")
    has(user_msgs[1], "requests no GPU", "msg")
    eq(last_decision(), "warn", "decision")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:v100:2" }), {}, 1000), slurm.ERROR, "unknown type")
    has(last_log(), "unknown GPU type 'v100'", "reason")
end)

case("time limit from the partition default", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:4", time_limit = 4294967294.0 })
    j.partition = "gpu"
    slurm_job_submit(j, { gpu = { default_time = 30.0, max_time = 4294967295.0 } }, 1000)
    has(last_log(), '"time_limit_minutes":30', "partition default")
    local j2 = job({ tpn = "gres:gpu:h100:4", time_limit = 4294967294.0 })
    slurm_job_submit(j2, { p = { flag_default = 1.0, default_time = 4294967295.0, max_time = 4294967295.0 } }, 1000)
    has(last_log(), '"time_limit_minutes":null', "unknown")
end)

case("log lines are JSON objects with the schema fields", function()
    for _, l in ipairs(log_lines()) do
        for _, k in ipairs({ '"time":"', '"source":"slurmctld"', '"decision":"', '"user":"alice"', '"uid":1000',
            '"spec_sha256":"', '"model":"', '"peak_bytes":', '"usable_bytes":', '"margin":{"percent":10.0,"bytes":0,"reserve_bytes":2147483648,"text":"10%+2147483648"}', '"reason":', '"action":"' }) do
            has(l, k, "log line")
        end
        has(l, '"spec":"/home/alice/llava \\"quoted\\".yaml"', "escaped spec path")
    end
end)

print(string.format("%d passed, %d failed", passed, failed))
if not arg[2] then os.remove(logout) end
os.remove(conf_file)
os.exit(failed == 0 and 0 or 1)
