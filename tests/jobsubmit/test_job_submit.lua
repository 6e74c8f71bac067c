--[[
tests/jobsubmit/test_job_submit.lua - unit tests of contrib/job_submit.lua without Slurm.

Run: lua5.1 tests/jobsubmit/test_job_submit.lua [path/to/job_submit.lua] [log-out]
A mock `slurm` table stands in for slurmctld's; job_desc is a plain table (the
22.05 field names).  The tables tests/unit/conf_cases.txt and
tests/unit/request_cases.txt, which the plugin's C tests also run, drive the
configuration and GPU-request cases, so the two readers agree.  The decision
log of every case is appended to LOG-OUT (default: a temp file) so that the
make rule can validate it with python3's json.  Prints "N passed, N failed";
exit status 0 when every case passes.
--]]

local script = arg[1] or "contrib/job_submit.lua"
local logout = arg[2] or os.tmpname()
if logout:sub(1, 1) ~= "/" then logout = (os.getenv("PWD") or ".") .. "/" .. logout end  -- ctld_log must be absolute
local root = script:match("^(.*)/contrib/[^/]*$") or "."

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
local real_conf_path = M.conf_path
M.conf_path = function() return conf_file end
local have_posix = pcall(require, "posix.fcntl")

local function write_file(path, text)
    local f = assert(io.open(path, "wb"))
    f:write(text)
    f:close()
end
local function write_conf(text)
    write_file(conf_file, text .. "\nctld_log=" .. logout .. "\n")
end

local function log_lines()
    local t = {}
    local f = io.open(logout, "r")
    if not f then return t end
    for l in f:lines() do t[#t + 1] = l end
    f:close()
    return t
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
local function last_log() local l = log_lines(); return l[#l] end
local function last_decision() return (last_log() or ""):match('"decision":"(%a+)"') end

-- ---- the shared case tables ------------------------------------------------

-- tests/unit/*_cases.txt: {name, text, expect} (format in conf_cases.txt)
local function load_table(path)
    local cases, cur, ended = {}, nil, false
    local function decode(s)
        local out, i = {}, 1
        while i <= #s do
            local c = s:sub(i, i)
            if c ~= "\\" then out[#out + 1] = c; i = i + 1
            else
                local e = s:sub(i + 1, i + 1)
                if e == "t" then out[#out + 1] = "\t"; i = i + 2
                elseif e == "r" then out[#out + 1] = "\r"; i = i + 2
                elseif e == "0" then out[#out + 1] = "\0"; i = i + 2
                elseif e == "\\" then out[#out + 1] = "\\"; i = i + 2
                elseif e == "E" then return table.concat(out), true
                elseif e == "{" then
                    local n, ch, rest = s:match("^\\{(%d+):(.)}()", i)
                    assert(n, "bad \\{N:c} escape in " .. path)
                    out[#out + 1] = ch:rep(tonumber(n)); i = rest
                else error("unknown escape \\" .. e .. " in " .. path) end
            end
        end
        return table.concat(out) .. "\n", false
    end
    for line in io.lines(path) do
        if line:sub(1, 3) == "== " then
            cur = { name = line:sub(4), text = "", expect = nil }
            cases[#cases + 1] = cur
            ended = false
        elseif cur and line:sub(1, 1) == "|" then
            assert(not ended, cur.name .. ": a line after \\E")
            local t, e = decode(line:sub(2, 2) == " " and line:sub(3) or line:sub(2))
            cur.text, ended = cur.text .. t, e
        elseif cur and line ~= "" and line:sub(1, 1) ~= "#" then
            cur.expect = line
        end
    end
    for _, c in ipairs(cases) do assert(c.expect, c.name .. ": no expectation") end
    return cases
end

local function conf_value(c, key)
    if key == "margin" then return M.margin_text(c)
    elseif key == "syslog" or key == "max_micro_batch" then return c[key] and "yes" or "no"
    elseif key == "log" or key == "ctld_log" then return c[key] or ""
    elseif key == "resize_types" then return table.concat(c.resize_types, ",")
    elseif key:sub(1, 4) == "gpu." then return c.gpus[key:sub(5)] and M.istr(c.gpus[key:sub(5)])
    elseif key:sub(1, 7) == "usable." then
        local g = c.gpus[key:sub(8)]
        return g and M.istr(M.usable_bytes(g, c))
    elseif type(c[key]) == "number" then return M.istr(c[key])
    end
    return c[key]
end

case("mmguard.conf: every case of tests/unit/conf_cases.txt", function()
    local cases = load_table(root .. "/tests/unit/conf_cases.txt")
    assert(#cases >= 50, "too few cases")
    for _, tc in ipairs(cases) do
        local c, err = M.parse_conf(tc.text, "FILE")
        local line, msg = tc.expect:match("^error (%d+) (.*)$")
        if line then
            local want = (line == "0" and "FILE: " or ("FILE:" .. line .. ": ")) .. msg
            if c then error(tc.name .. ": accepted, want " .. want) end
            if err:sub(1, #want) ~= want then error(tc.name .. ": got '" .. err .. "', want '" .. want .. "...'") end
        else
            if not c then error(tc.name .. ": " .. tostring(err)) end
            for k, v in tc.expect:sub(4):gmatch("(%S+)=(%S*)") do
                eq(conf_value(c, k), v, tc.name .. ": " .. k)
            end
        end
    end
end)

local function job_fields(text)
    local j = { min_nodes = 4294967294, max_nodes = 4294967294, num_tasks = 4294967294,
                ntasks_per_node = 65534 }
    local names = { tpn = "tres_per_node", tpj = "tres_per_job", tpt = "tres_per_task",
                    tps = "tres_per_socket", ntpn = "ntasks_per_node" }
    for k, v in text:gmatch("(%S+)=(%S*)") do
        local f = names[k] or k
        j[f] = (f:sub(1, 5) == "tres_") and v or tonumber(v)
    end
    return j
end

case("GPU requests: every case of tests/unit/request_cases.txt", function()
    local cases = load_table(root .. "/tests/unit/request_cases.txt")
    assert(#cases >= 20, "too few cases")
    for _, tc in ipairs(cases) do
      if tc.expect:sub(1, 4) ~= "mem " then   -- host memory: the next case
        local req, status, why = M.eval_request(job_fields(tc.text))
        if req then
            local got = string.format("ok gpus=%s type=%s nodes=%s-%s", M.istr(req.gpus), req.type or "",
                M.istr(req.nodes_min), M.istr(req.nodes_max))
            eq(got, tc.expect, tc.name)
        elseif status == "none" then
            eq("none", tc.expect, tc.name)
        else
            local want = tc.expect:match("^unknown (.*)$")
            if not want then error(tc.name .. ": unknown (" .. why .. "), want " .. tc.expect) end
            if why:sub(1, #want) ~= want then error(tc.name .. ": '" .. why .. "', want '" .. want .. "...'") end
        end
      end
    end
end)

-- The "mem" cases: job_desc memory fields as 22.05 shows them to Lua, the
-- site's defaults, the host need and the size to ask for.
local function mem_case_fields(text)
    local j = job_fields("")
    local site = { def_mem_per_node = 0, def_mem_per_cpu = 0, def_mem_per_gpu = 0, node_mem = 0,
                   max_gpus_per_node = 8 }
    local host, ovh = 0, 3221225472
    local sitekeys = { dmn = "def_mem_per_node", dmc = "def_mem_per_cpu", dmg = "def_mem_per_gpu",
                       node_mem = "node_mem", maxgpn = "max_gpus_per_node" }
    local jobkeys = { mpn = "min_mem_per_node", mpc = "min_mem_per_cpu", cpt = "cpus_per_task",
                      mincpus = "pn_min_cpus" }
    local rest = {}
    for k, v in text:gmatch("(%S+)=(%S*)") do
        if sitekeys[k] then site[sitekeys[k]] = tonumber(v)
        elseif jobkeys[k] then j[jobkeys[k]] = tonumber(v)
        elseif k == "mpg" then j.mem_per_tres = "gres:gpu:" .. v
        elseif k == "cpg" then j.cpus_per_tres = "gres:gpu:" .. v
        elseif k == "host" then host = tonumber(v)
        elseif k == "ovh" then ovh = tonumber(v)
        else rest[#rest + 1] = k .. "=" .. v end
    end
    for k, v in pairs(job_fields(table.concat(rest, " "))) do j[k] = v end
    return j, site, host, ovh
end

case("host memory: every mem case of tests/unit/request_cases.txt", function()
    local n = 0
    for _, tc in ipairs(load_table(root .. "/tests/unit/request_cases.txt")) do
        if tc.expect:sub(1, 4) == "mem " then
            n = n + 1
            local j, site, host, ovh = mem_case_fields(tc.text)
            local req, _, why = M.eval_request(j)
            if not req then error(tc.name .. ": " .. tostring(why)) end
            local st, node = M.host_request(j, req, site)
            local got
            if st == "whole" then
                got = string.format("mem whole ranks=%s cpus=%s", M.istr(node.ranks), M.istr(node.cpus))
            else
                local need = node.ranks * (host + ovh)
                local _, ask = M.mem_ask(node, need)
                got = string.format("mem sized kind=%s default=%s ranks=%s cpus=%s have=%s need=%s fits=%s ask=%s",
                    node.kind, node.from_default and "yes" or "no", M.istr(node.ranks), M.istr(node.cpus),
                    M.istr(node.have), M.istr(need), need <= node.have and "yes" or "no", ask)
            end
            eq(got, tc.expect, tc.name)
        end
    end
    assert(n >= 15, "too few mem cases")
end)

-- ---- arithmetic and the published record ------------------------------------------

-- 10 GiB replicated + 120 GiB sharded, afrac 0.05, afix 512 MiB, ctx 1 GiB,
-- nccl 1 GiB: peak(1)=138 GiB, peak(2)=76, peak(3)=55, peak(4)=44.5.
-- h100 usable (10% margin, 2 GiB reserve) = 69.68 GiB; h200 = 124.4 GiB.
-- The verdicts the plugin publishes (cards=), here from the peak model: a
-- card fits when peak(N) <= usable under the decision tests' BASE
-- configuration, else is out of memory; o.flushes = { ["h100:4"] = RETRIES }
-- makes those cards fit only with cache flushes.
local function cards(r, o)
    local base = assert(M.parse_conf("margin=10%\nreserve=2GiB\n", "BASE"))
    local m = assert(M.parse_record(M.format_record(r)))
    local list = {}
    for _, t in ipairs({ "h100", "h200", "a100" }) do
        local usable = M.usable_bytes(base.gpus[t], base)
        for n = 1, 16 do
            local pk = M.peak_for_dp(m, n)
            local fl = o.flushes and o.flushes[t .. ":" .. n]
            if pk then
                list[#list + 1] = { gpu = t, usable = o.usable or usable, n = n,
                    kind = fl and "flushes" or pk <= usable and "fits" or "oom", retries = fl or 0,
                    peak = pk <= usable and pk or usable }
            end
        end
    end
    return list
end

local function record(o)
    o = o or {}
    local r = {
        decision = o.decision or "accept", spec = "/home/alice/llava \"quoted\".yaml",
        sha256 = string.rep("ab", 32), model = "llava-1.5-7b-finetune", gpu = "h100",
        gpu_mem = 81559 * MiB, usable = 70 * GiB, dp = o.dp or 4, request = "h100:4x1-1/node",
        peak = 44 * GiB, alloc = 40 * GiB, mmb = 4, host = o.host,
        ctx = GiB, nccl = GiB, afix = 512 * MiB, afrac = 0.05,
        dp1 = o.dp1 or 130 * GiB, terms = o.terms or { { 10 * GiB, 120 * GiB }, { 20 * GiB, 0 } },
        res = o.res or { { 1, 4294967295, 0, 0 } },
    }
    if not o.nocards then r.cards = cards(r, o) end
    return M.format_record(r)
end
local HUGE = record({ terms = { { 500 * GiB, 10 * GiB } }, dp1 = 510 * GiB })

case("peak model arithmetic, allocator slack per replayed degree", function()
    local m = assert(M.parse_record(record()))
    -- +1: the double 0.05 is slightly above 1/20, the slack is rounded up
    eq(M.peak_for_dp(m, 1), 138 * GiB + 1, "peak(1)")
    eq(M.peak_for_dp(m, 2), 76 * GiB + 1, "peak(2)")
    eq(M.peak_for_dp(m, 4), 44 * GiB + 512 * MiB + 1, "peak(4)")
    -- reserved 133 GiB at N=1 (3 above allocated), 42 at N=2 and 3 (allocated 70 at 2:
    -- no slack there, 50 at 3), nothing known at 4 and 5, 1 GiB paged from 6 on
    local s = assert(M.parse_record(record({ res = { { 1, 1, 133 * GiB, 0 }, { 2, 3, 42 * GiB, 0 },
                                                      { 6, 4294967295, 0, GiB } } })))
    eq(M.peak_for_dp(s, 1), 141 * GiB + 1, "slack at N=1")
    eq(M.peak_for_dp(s, 2), 76 * GiB + 1, "reserved below allocated: no slack")
    eq(M.peak_for_dp(s, 3), 55 * GiB + 1, "peak(3)")
    eq(M.peak_for_dp(s, 4), nil, "not replayed at 4: unknown")
    eq(M.peak_for_dp(s, 5), nil, "nor at 5")
    -- allocated(40) = 20 GiB: 21 + afix 0.5 + ctx 1 + nccl 1 + paged 1
    eq(M.peak_for_dp(s, 40), 24 * GiB + 512 * MiB + 1, "paged bytes added")
    eq(M.ceil_mul(100, 0.05), 6, "100 * 0.05000000000000000277 -> 6")
    eq(M.ceil_mul(3, 0.1), 1, "0.3 -> 1")
    local q, rem = M.muldiv(9007199254740991, 999999999, 1000000000)
    eq(M.istr(q), "9007199245733791", "floor(a*b/d) beyond 2^53 products")
    eq(rem, true, "with a remainder")
end)

case("the MMGUARD record: round trip and hostile text", function()
    local m = assert(M.parse_record(record()))
    eq(m.spec, "/home/alice/llava \"quoted\".yaml", "decoded path")
    eq(M.format_record(m), record(), "round trip")
    has(record(), 'spec=/home/alice/llava%20"quoted".yaml ', "blanks encoded (as record.c does)")
    local model = "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1 res="
    for _, bad in ipairs({ "", "v=1 decision=accept", "v=2 decision=accept", "v=4 decision=accept decision=warn",
        "v=4 color=red", "v=4 slack=1",
        "v=4  decision=accept", "v=4 peak=12a", "v=4 peak=99999999999999999999", "v=4 spec=%0Aetc",
        "v=4 spec=%00", "v=4 spec=ab%4", "v=4 decision=acceptable", "v=4 ctx=1 nccl=1",
        "v=4 afrac=nan ctx=1 nccl=1 afix=1 dp1=1 terms=1:1 res=1-1:0:0",
        "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1, res=1-1:0:0",
        model, model .. "1-1:0:0,", model .. "0-1:0:0", model .. "2-1:0:0", model .. "1-2:0",
        model .. "1-2:0:0,2-3:0:0", model .. "3-4:0:0,1-2:0:0", model .. "1-4294967296:0:0",
        model .. "1-1:0:x", model .. string.rep("1-1:0:0,", 64) .. "1-1:0:0",
        model .. "1-1:0:0:0", model .. "1-1:0:0:x", model .. "1-1:0:0:1:2" }) do
        eq(M.parse_record(bad), nil, "parse of '" .. bad .. "'")
    end
    assert(M.parse_record(model .. "1-1:0:0,2-3:5:6,7-4294967295:0:0"), "three ranges")
    -- a range with its own allocated peak (a per-degree ZeRO / FSDP point) uses it
    local half = "v=4 afrac=0.5 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1 res="
    eq(M.peak_for_dp(assert(M.parse_record(half .. "1-1:100:0:50")), 1), 50 + 25 + 1 + 50 + 1,
       "own allocated")
    eq(M.format_record(assert(M.parse_record(half .. "1-1:100:0:50,2-3:7:0"))),
       "v=4 ctx=1 nccl=1 afix=1 afrac=0.5 dp1=1 terms=1:1 res=1-1:100:0:50,2-3:7:0",
       "a per-degree point's allocated peak survives a rewrite")
    eq(M.peak_for_dp(assert(M.parse_record(half .. "1-1:100:0")), 1), 1 + 1 + 1 + 99 + 1,
       "allocated from dp1")
    eq(M.parse_record("v=4 " .. string.rep("x", 17000)), nil, "too long")
    eq(M.parse_record("v=3 decision=accept"), nil, "the previous version")
    -- cards=: the plugin's verdicts per (GPU type, count)
    local ok = assert(M.parse_record("v=4 cards=h100:100:4:flushes:3:90,H200:200:4:fits:0:10"))
    eq(M.card(ok, "h100", 4).kind, "flushes", "card kind")
    eq(M.card(ok, "h100", 4).retries, 3, "card retries")
    eq(M.card(ok, "h200", 4).peak, 10, "type case-insensitive")
    eq(M.card(ok, "h100", 3), nil, "no card at 3")
    eq(M.format_record(ok), "v=4 cards=h100:100:4:flushes:3:90,H200:200:4:fits:0:10", "cards round trip")
    for _, bad in ipairs({ "cards=", "cards=h100:100:4:fits:0:10,", "cards=h100:100:4:fits:0:101",
        "cards=h100:100:0:fits:0:10", "cards=h100:100:4:maybe:0:10", "cards=h100:100:4:fits:0",
        "cards=h100:100:4:fits:0:10,H100:100:4:oom:0:10", "cards=h1%00:100:4:fits:0:10",
        "cards=" .. string.rep("x", 32) .. ":100:4:fits:0:10", "cards=h100:100:4294967296:fits:0:10",
        "cards=h100:1e3:4:fits:0:10", "cards=h100:100:4:fits:-1:10",
        "cards=" .. string.rep("h100:100:4:fits:0:10,", 1):sub(1, -2) .. "," .. (function()
            local t = {} for i = 1, 64 do t[i] = "a:100:" .. i .. ":fits:0:1" end return table.concat(t, ",") end)() }) do
        eq(M.parse_record("v=4 " .. bad), nil, "parse of '" .. bad:sub(1, 60) .. "'")
    end
end)

case("sizes", function()
    eq(M.parse_size("81559MiB"), 81559 * MiB, "MiB")
    eq(M.parse_size(" 2 GiB "), 2 * GiB, "blanks")
    eq(M.parse_size("1.5"), 1, "1.5 bytes floors")
    eq(M.parse_size("GiB"), nil, "no number")
    eq(M.parse_size("9007199254740992"), nil, "2^53")
    eq(M.format_bytes(math.floor(71.3 * GiB)), "71.3 GiB", "format")
    eq(M.json_double(5), "5.0"); eq(M.json_double(0.1), "0.1")
end)

case("json escaping", function()
    eq(M.json_string('a"b\\c\n\t\1'), '"a\\"b\\\\c\\n\\t\\u0001"')
    eq(M.json_string("caf\195\169"), '"caf\195\169"', "valid utf-8 kept")
    eq(M.json_string("x\255y"), '"x\239\191\189y"', "invalid byte replaced")
    eq(M.json_object({ { "a", 1 }, { "b", nil }, { "c", 0.5 }, { "e", true } }),
        '{"a":1,"b":null,"c":0.5,"e":true}')
end)

case("mmguard.conf is found next to the script; MMGUARD_CONF overrides", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local src = assert(io.open(script, "rb")):read("*a")
    write_file(dir .. "/job_submit.lua", src)
    local saved, submit, modify = mmguard_jobsubmit, slurm_job_submit, slurm_job_modify
    dofile(dir .. "/job_submit.lua")
    local path = mmguard_jobsubmit.conf_path()
    mmguard_jobsubmit, slurm_job_submit, slurm_job_modify = saved, submit, modify
    os.execute("rm -rf '" .. dir .. "'")
    if os.getenv("MMGUARD_CONF") then
        eq(path, os.getenv("MMGUARD_CONF"), "environment override")
    else
        eq(path, dir .. "/mmguard.conf", "next to the script")
    end
    eq(type(real_conf_path()), "string", "conf_path")
end)

-- ---- decisions ---------------------------------------------------------------------

local function job(o)
    o = o or {}
    local spank
    if o.mm ~= false then spank = { [0] = "OTHER_PLUGIN=x=y", "MMGUARD=" .. (o.model or record()) } end
    return {
        name = o.name or "train", user_name = "alice", user_id = 1000.0,
        min_nodes = o.nodes or 4294967294.0, max_nodes = o.max_nodes or o.nodes or 4294967294.0,
        time_limit = o.time_limit or 120.0, tres_per_node = o.tpn, tres_per_job = o.tpj,
        tres_per_task = o.tpt, tres_per_socket = o.tps,
        ntasks_per_node = o.ntasks_per_node or 65534.0, num_tasks = o.num_tasks or 4294967294.0,
        spank_job_env = spank, environment = o.env or { PATH = "/usr/bin" },
        admin_comment = o.admin_comment, min_mem_per_node = o.mem, min_mem_per_cpu = o.mem_per_cpu,
        mem_per_tres = o.mem_per_tres, cpus_per_task = o.cpus_per_task or 65534.0,
        pn_min_cpus = 65534.0,
    }
end

local BASE = "margin=10%\nreserve=2GiB\ndefault_gpu=h100\n"

case("no --mm-model, require=off: untouched, no log", function()
    write_conf(BASE .. "action=resize\n")
    local before = #log_lines()
    local j = job({ mm = false, tpn = "gres:gpu:h100:1" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:1", "tres")
    eq(#log_lines(), before, "no log line")
    eq(#user_msgs, 0, "no user message")
end)

case("require=warn / reject for GPU jobs without --mm-model", function()
    write_conf(BASE .. "require=warn\n")
    eq(slurm_job_submit(job({ mm = false, tpn = "gres:gpu:h100:1" }), {}, 1000), slurm.SUCCESS, "warn")
    has(user_msgs[1], "WARNING: GPU job without --mm-model (require=warn)", "warning")
    eq(last_decision(), "warn", "logged")
    write_conf(BASE .. "require=reject\n")
    eq(slurm_job_submit(job({ mm = false, tpj = "gres:gpu:2" }), {}, 1000), slurm.ERROR, "reject")
    has(user_msgs[#user_msgs], "job rejected: GPU job without --mm-model", "told")
    eq(last_decision(), "reject", "logged")
    -- CPU jobs are never touched
    local before = #log_lines()
    eq(slurm_job_submit(job({ mm = false, tpn = "gres:shard:1" }), {}, 1000), slurm.SUCCESS, "cpu job")
    eq(#log_lines(), before, "not logged")
    -- a broken configuration never blocks jobs without --mm-model
    write_conf("require=reject\nbogus=1\n")
    eq(slurm_job_submit(job({ mm = false, tpn = "gres:gpu:1" }), {}, 1000), slurm.SUCCESS, "broken conf")
    has(errors[#errors], "require= not applied", "logged for the admin")
end)

case("fits: accepted untouched", function()
    write_conf(BASE .. "action=resize\n")
    local j = job({ tpn = "gres:gpu:h100:4" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:4", "tres")
    eq(j.admin_comment, nil, "comment")
    eq(last_decision(), "accept", "decision")
    has(last_log(), '"request":"h100:4x1-1/node"', "request logged")
    has(last_log(), '"plugin_request":"h100:4x1-1/node"', "the plugin's request logged")
    eq(#user_msgs, 0, "silent")
end)

case("reject: the real request, not the plugin's", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:2" })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rc")
    has(user_msgs[1], "job rejected: predicted peak 76.0 GiB per GPU does not fit h100", "user msg")
    has(user_msgs[1], "with 2 GPUs (gres:gpu:h100:2 on 1 node)", "request in the message")
    has(user_msgs[1], "to fit: ask for 3 GPUs per node (gpu:h100:3)", "suggestion")
    eq(last_decision(), "reject", "decision")
    has(last_log(), '"gpus":2', "gpus")
    has(last_log(), '"plugin_data_parallel":4', "plugin's N kept for comparison")
    has(last_log(), '"time_limit_minutes":120', "time limit")
end)

case("GPUs per task and node ranges", function()
    write_conf(BASE .. "action=reject\n")
    eq(slurm_job_submit(job({ tpt = "gres:gpu:1", num_tasks = 4.0 }), {}, 1000), slurm.SUCCESS, "4 x 1 fits")
    has(last_log(), '"gpus":4', "per task")
    eq(slurm_job_submit(job({ tpt = "gres:gpu:1", num_tasks = 2.0 }), {}, 1000), slurm.ERROR, "2 x 1 does not")
    -- one node of 4 fits
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", nodes = 1.0, max_nodes = 3.0 }), {}, 1000), slurm.SUCCESS, "range")
end)

case("warn: accepted with a warning", function()
    write_conf(BASE .. "action=warn\n")
    local j = job({ tpn = "gres:gpu:h100:2" })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:2", "untouched")
    has(user_msgs[1], "WARNING", "warning")
    eq(last_decision(), "warn", "decision")
end)

-- 4 h100s fit only with cache flushes (3 cudaMalloc retries per step), 5 fit
local FLUSH4 = record({ flushes = { ["h100:4"] = 3 } })

case("flush=warn (default): submitted with a warning that says the cost", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:4", model = FLUSH4 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:4", "untouched")
    has(user_msgs[1], "WARNING: predicted peak", "a warning")
    has(user_msgs[1], "only with cache flushes (3 cudaMalloc retries per step)", "how many")
    has(user_msgs[1], "each flush synchronises the device: slower", "the cost")
    has(user_msgs[1], "(flush=warn)", "the policy")
    eq(last_decision(), "warn", "decision")
    has(last_log(), '"verdict":"flushes"', "verdict logged")
    has(last_log(), '"alloc_retries_per_step":3', "retries logged")
    has(last_log(), '"flush":"warn"', "policy logged")
end)

case("flush=accept: accepted with an info line", function()
    write_conf(BASE .. "action=reject\nflush=accept\n")
    local j = job({ tpn = "gres:gpu:h100:4", model = FLUSH4 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(#user_msgs, 1, "one line")
    eq(user_msgs[1]:find("WARNING", 1, true), nil, "not a warning")
    has(user_msgs[1], "only with cache flushes", "said")
    eq(last_decision(), "accept", "decision")
end)

case("flush=reject: a misfit under action=reject, resized under action=resize", function()
    write_conf(BASE .. "action=reject\nflush=reject\n")
    local j = job({ tpn = "gres:gpu:h100:4", model = FLUSH4 })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rejected")
    has(user_msgs[1], "job rejected: predicted peak", "told")
    has(user_msgs[1], "flush=reject", "why")
    eq(last_decision(), "reject", "decision")
    write_conf(BASE .. "action=resize\nflush=reject\n")
    user_msgs = {}
    j = job({ tpn = "gres:gpu:h100:4", model = FLUSH4 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "resized")
    eq(j.tres_per_node, "gres:gpu:h100:5", "to the first count that fits without flushes")
    has(last_log(), '"new_verdict":"fits"', "the new verdict logged")
    -- flush=warn: the same job is not resized
    write_conf(BASE .. "action=resize\n")
    j = job({ tpn = "gres:gpu:h100:4", model = FLUSH4 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:4", "flush=warn: not resized")
end)

case("verdicts: the published card decides, not the peak model", function()
    write_conf(BASE .. "action=reject\n")
    -- the model says 44.5 GiB fits at 4, the card says out of memory
    local oom = record({ flushes = {} }):gsub("h100:(%d+):4:fits:0:(%d+)", "h100:%1:4:oom:0:%2")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = oom }), {}, 1000), slurm.ERROR, "card")
    has(user_msgs[1], "does not fit h100", "told")
    has(last_log(), '"verdict":"oom"', "logged")
    -- no card for the request, a card for another usable memory: on_error
    user_msgs = {}
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = record({ nocards = true }) }), {}, 1000),
       slurm.ERROR, "no cards")
    has(user_msgs[1], "no prediction published", "no cards: told")
    user_msgs = {}
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:20" }), {}, 1000), slurm.ERROR, "not covered")
    has(user_msgs[1], "no verdict for 20 GPUs of h100", "uncovered count: told")
    user_msgs = {}
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = record({ usable = 1000 * GiB }) }), {}, 1000),
       slurm.ERROR, "other usable")
    has(user_msgs[1], "mmguard.conf here gives", "another usable: told")
end)

case("resize: more GPUs of the same type; the job's record follows", function()
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=8\nresize_types=h200\n")
    local env = { SLURM_GPUS_PER_NODE = "h100:2", SBATCH_GRES = "gpu:h100:2",
                  SLURM_SPANK_MMGUARD = record({ dp = 2 }) }
    local j = job({ tpn = "gres:gpu:h100:2,gres:shard:1", env = env, ntasks_per_node = 2.0 })
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:3,gres:shard:1", "tres")
    eq(j.admin_comment, "mmguard: resized gpu:h100:2 -> gpu:h100:3, predicted 55.0 GiB/GPU", "comment")
    eq(env.SLURM_GPUS_PER_NODE, "h100:3", "env")
    eq(env.SBATCH_GRES, "gpu:h100:3", "env gres")
    eq(j.ntasks_per_node, 3, "one task per GPU kept")
    local m = assert(M.parse_record(env.SLURM_SPANK_MMGUARD))
    eq(m.dp, 3, "record: data-parallel degree")
    eq(m.peak, 55 * GiB + 1, "record: peak")
    eq(m.mmb, nil, "record: the old micro-batch is dropped")
    eq(m.admission, "resized gpu:h100:2 -> gpu:h100:3", "record: admission")
    has(user_msgs[1], "resized to gpu:h100:3", "user msg")
    eq(last_decision(), "resize", "decision")
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
    has(last_log(), '"new_gpu":"h200"', "log")
end)

case("resize: per-node maximum respected with several nodes", function()
    write_conf(BASE .. "action=resize\nmax_gpus_per_node=2\n")
    local j = job({ tpn = "gres:gpu:h100:1", nodes = 2.0 })   -- N=2 does not fit, N=4 does
    eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:2", "2 per node on 2 nodes")
    local j2 = job({ tpn = "gres:gpu:h100:1" })               -- would need 3 on one node
    eq(slurm_job_submit(j2, {}, 1000), slurm.ERROR, "rc")
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
    -- the host bytes per process stay (an upper bound at more GPUs)
    local env2 = { SLURM_SPANK_MMGUARD = record({ dp = 2, host = 30 * GiB }) }
    eq(slurm_job_submit(job({ tpj = "gres:gpu:2", env = env2, num_tasks = 2.0, model = record({ dp = 2, host = 30 * GiB }) }), {}, 1000), slurm.SUCCESS, "rc")
    eq(assert(M.parse_record(env2.SLURM_SPANK_MMGUARD)).host, 30 * GiB, "record: host per process kept")
end)

case("nothing fits: reject", function()
    write_conf(BASE .. "action=resize\nresize_types=h200\n")
    local j = job({ tpn = "gres:gpu:h100:1", model = HUGE })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rc")
    eq(j.tres_per_node, "gres:gpu:h100:1", "untouched")
    has(user_msgs[1], "no resize fits", "msg")
end)

-- ---- host memory -------------------------------------------------------------------

-- 30 GiB offloaded per process at the plugin's 4 GPUs (record dp=4)
local HOSTREC = record({ host = 30 * GiB })
local function host_log() return (last_log() or ""):match('"host":(%b{})') end

case("host memory: --mem too small for the offloaded states: rejected, with the size to ask for", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 65536.0 })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rc")
    has(user_msgs[1], "job rejected: predicted host memory 132.0 GiB per node (4 GPU processes x (30.0 GiB offloaded + 3.0 GiB runtime)) does not fit the 64.0 GiB the job gets (--mem=65536M)", "message")
    has(user_msgs[1], "to fit: --mem=132G", "the size to ask for")
    eq(last_decision(), "reject", "decision")
    has(host_log(), '"result":"misfit"', "logged")
    has(host_log(), '"need_bytes":141733920768', "need")
    has(host_log(), '"have_bytes":68719476736', "have")
end)

case("host memory: enough --mem passes; host_mem=off and action=warn", function()
    write_conf(BASE .. "action=reject\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 140000.0 }), {}, 1000), slurm.SUCCESS, "fits")
    eq(last_decision(), "accept", "accept")
    has(host_log(), '"result":"fits"', "logged")
    eq(#user_msgs, 0, "silent")
    write_conf(BASE .. "action=reject\nhost_mem=off\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 1024.0 }), {}, 1000), slurm.SUCCESS, "off")
    eq(host_log(), nil, "not checked")
    for _, c in ipairs({ "action=warn\n", "action=reject\nhost_mem=warn\n" }) do
        write_conf(BASE .. c)
        eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 1024.0 }), {}, 1000), slurm.SUCCESS, c)
        has(user_msgs[#user_msgs], "WARNING: predicted host memory", "warned")
        eq(last_decision(), "warn", "decision")
    end
    -- action=resize: nothing resizes memory; slurmctld rejects (the plugin only warned)
    write_conf(BASE .. "action=resize\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 1024.0 }), {}, 1000), slurm.ERROR, "resize")
end)

case("host memory: per GPU, per CPU, site defaults, the whole node", function()
    write_conf(BASE .. "action=reject\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem_per_tres = "gres:gpu:20480" }), {}, 1000), slurm.ERROR, "per GPU")
    has(user_msgs[#user_msgs], "(--mem-per-gpu=20480M x 4 GPUs); to fit: --mem-per-gpu=33G", "per GPU ask")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem_per_cpu = 8192.0, cpus_per_task = 8.0,
        num_tasks = 4.0, ntasks_per_node = 4.0 }), {}, 1000), slurm.SUCCESS, "per CPU: 4 x 8 CPUs x 8 GiB")
    has(host_log(), '"request":"--mem-per-cpu=8192M x 32 CPUs"', "per CPU")
    -- no request and no default: the whole node, not checked
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC }), {}, 1000), slurm.SUCCESS, "whole node")
    has(host_log(), '"result":"unchecked"', "unchecked")
    -- the site's DefMemPerGPU, asked back as --mem
    write_conf(BASE .. "action=reject\ndef_mem_per_gpu=16GiB\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC }), {}, 1000), slurm.ERROR, "default per GPU")
    has(user_msgs[#user_msgs], "the 64.0 GiB the job gets (no --mem: the site's def_mem_per_gpu=16.0 GiB x 4 GPUs); to fit: --mem=132G", "default")
    -- --mem=0 with node_mem: the node's memory is all there is
    write_conf(BASE .. "action=reject\nnode_mem=100GiB\n")
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", model = HOSTREC, mem = 0.0 }), {}, 1000), slurm.ERROR, "whole node too small")
    has(user_msgs[#user_msgs], "the 100.0 GiB the job gets (a whole node: --mem=0, node_mem in mmguard.conf); to fit: fewer GPU processes per node", "whole")
end)

case("host memory at another GPU count: an upper bound whatever the offload", function()
    write_conf(BASE .. "action=reject\n")
    -- 2 GPUs (fewer than the plugin's 4): partitioned states grow at most 4/2: 60 GiB each
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:2", model = HOSTREC, mem = 120000.0 }), {}, 1000), slurm.ERROR, "N=2")
    has(user_msgs[1], "126.0 GiB per node (2 GPU processes x (60.0 GiB offloaded + 3.0 GiB runtime))", "scaled up")
    -- 8 GPUs: offloaded activations do not shrink with N: kept at 30 GiB
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:8", model = HOSTREC, mem = 280000.0 }), {}, 1000), slurm.SUCCESS, "N=8")
    has(host_log(), '"need_bytes":283467841536', "8 x 33 GiB")
    -- on 2 nodes of 4: 4 processes per node
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4", nodes = 2.0, model = HOSTREC, mem = 140000.0 }), {}, 1000), slurm.SUCCESS, "2 nodes")
    has(host_log(), '"processes":4', "per node")
end)

case("cannot decide (malformed record, no GPU, per socket, unknown type): on_error", function()
    for _, o in ipairs({ { tpn = "gres:gpu:h100:1", model = "v=4 ctx=12 garbage" },
                          { tpn = "gres:shard:1" }, { tps = "gres:gpu:1" },
                          { tpn = "gres:gpu:v100:2" },
                          { tpn = "gres:gpu:1", model = "v=4 decision=error error=bad%20spec" } }) do
        write_conf(BASE .. "action=resize\non_error=allow\n")
        local j = job(o)
        eq(slurm_job_submit(j, {}, 1000), slurm.SUCCESS, "allow")
        eq(last_decision(), "error", "decision")
        write_conf(BASE .. "action=resize\non_error=reject\n")
        eq(slurm_job_submit(job(o), {}, 1000), slurm.ERROR, "reject")
        has(user_msgs[#user_msgs], "on_error=reject", "user told")
    end
    has(last_log(), "the submit-time check failed: bad spec", "the plugin's error")
end)

case("a broken mmguard.conf refuses --mm-model jobs whatever on_error says", function()
    write_conf(BASE .. "action=resize\nfrobnicate=yes\non_error=allow\n")
    local j = job({ tpn = "gres:gpu:h100:1" })
    eq(slurm_job_submit(j, {}, 1000), slurm.ERROR, "rejected")
    has(user_msgs[1], "unknown key 'frobnicate'", "named")
    eq(j.tres_per_node, "gres:gpu:h100:1", "untouched")
    os.remove(conf_file)
    eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:1" }), {}, 1000), slurm.ERROR, "missing file")
    has(user_msgs[#user_msgs], "cannot open config file", "named")
end)

case("time limit from the partition default", function()
    write_conf(BASE .. "action=reject\n")
    local j = job({ tpn = "gres:gpu:h100:4", time_limit = 4294967294.0 })
    j.partition = "gpu"
    slurm_job_submit(j, { gpu = { default_time = 30.0, max_time = 4294967295.0 } }, 1000)
    has(last_log(), '"time_limit_minutes":30', "partition default")
end)

case("ctld_log: never through a symlink, never blocking on a FIFO", function()
    if not have_posix then
        print("SKIP ctld_log safety: lua-posix not installed")
        error("lua-posix is needed for this test (Debian: lua-posix)")
    end
    local dir = os.tmpname(); os.remove(dir); assert(os.execute("mkdir -p '" .. dir .. "'"))
    local target = dir .. "/target"
    write_file(target, "keep\n")
    assert(os.execute("ln -s '" .. target .. "' '" .. dir .. "/link' && mkfifo '" .. dir .. "/fifo'"))
    for _, name in ipairs({ "link", "fifo" }) do
        write_file(conf_file, BASE .. "ctld_log=" .. dir .. "/" .. name .. "\n")
        eq(slurm_job_submit(job({ tpn = "gres:gpu:h100:4" }), {}, 1000), slurm.SUCCESS, name .. ": decision stands")
        has(errors[#errors], "cannot append the decision record", name .. ": reported")
    end
    eq(assert(io.open(target)):read("*a"), "keep\n", "the symlink's target is unchanged")
    write_file(conf_file, BASE .. "ctld_log=" .. dir .. "/new.jsonl\n")
    slurm_job_submit(job({ tpn = "gres:gpu:h100:4" }), {}, 1000)
    has(assert(io.open(dir .. "/new.jsonl")):read("*a"), '"decision":"accept"', "a regular file is written")
    os.execute("rm -rf '" .. dir .. "'")
end)

case("log lines are JSON objects with the schema fields", function()
    for _, l in ipairs(log_lines()) do
        for _, k in ipairs({ '"time":"', '"source":"slurmctld"', '"decision":"', '"user":"alice"', '"uid":1000',
            '"reason":', '"action":"', '"require":"' }) do
            has(l, k, "log line")
        end
    end
    has(table.concat(log_lines(), "\n"), '"spec":"/home/alice/llava \\"quoted\\".yaml"', "escaped spec path")
end)

print(string.format("%d passed, %d failed", passed, failed))
if not arg[2] then os.remove(logout) end
os.remove(conf_file)
os.exit(failed == 0 and 0 or 1)
