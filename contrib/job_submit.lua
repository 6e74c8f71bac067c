--[[
contrib/job_submit.lua - mmguard's admission check at slurmctld (JobSubmitPlugins=lua).

Why this file exists: the mmguard SPANK plugin judges a job early, in the user's
sbatch/salloc/srun, from the GPU request it rebuilds from the command line,
#SBATCH lines and environment.  Here slurmctld sees the request it will
actually allocate (job_desc), so this script makes the authoritative decision:
it recomputes the per-GPU peak for that many GPUs from the prediction the
plugin published (the MMGUARD variable in job_desc.spank_job_env) and accepts,
warns, rejects or resizes the job (mmguard.conf `action=`).  It also applies
`require=` to GPU jobs that carry no --mm-model.  The prediction is trusted as
published: a user who bypasses the plugin can forge it (docs/plugin.md, "What
is enforced where").

Install: next to slurm.conf as job_submit.lua, JobSubmitPlugins=lua.  It reads
mmguard.conf from the same directory (MMGUARD_CONF in slurmctld's environment
overrides that) with the same rules as the plugin: tests/unit/conf_cases.txt
holds the cases both readers must agree on.

Lua: Debian's slurm-wlm 22.05 runs job_submit.lua in Lua 5.1 (liblua5.1), where
numbers are doubles: byte counts are exact integers below 2^53 and every input
is checked against that.  The script is written for 5.1 and runs unchanged on
5.3 and 5.4; `make check-jobsubmit` tests it with every one installed.  The
ctld_log is written through lua-posix (O_NOFOLLOW); without it that log is off.
--]]

local M = {}             -- internals, exported as the global `mmguard_jobsubmit` for tests

-- Where this script was loaded from (slurmctld loads it next to slurm.conf).
local SCRIPT_SOURCE = (debug and debug.getinfo and debug.getinfo(1, "S") or {}).source or ""

local KiB = 1024
local MiB = KiB * 1024
local GiB = MiB * 1024
local MAXEXACT = 2 ^ 53
local MAXSIZE = MAXEXACT - 1   -- the largest size mmguard.conf accepts (as the plugin)
local NO_VAL = 4294967294      -- 0xfffffffe, Slurm's "not set" for uint32 fields
local NO_VAL16 = 65534
local INFINITE = 4294967295
local MAX_GPUS = 65536         -- the spec's limit for training.data_parallel

------------------------------------------------------------------------------
-- Exact integer arithmetic on doubles (all values below 2^53).
------------------------------------------------------------------------------

local function is_int(x)
    return type(x) == "number" and x == math.floor(x) and x >= -MAXEXACT and x <= MAXEXACT
end

-- Integer as decimal text (no exponent, whatever the Lua version).
local function istr(x)
    return string.format("%.0f", x)
end
M.istr = istr

-- floor(a / d) for integers 0 <= a < 2^53, d >= 1.
local function idiv(a, d)
    local q = math.floor(a / d)
    while q * d > a do q = q - 1 end
    while a - q * d >= d do q = q + 1 end
    return q
end

local function ceil_div(a, d)
    local q = idiv(a, d)
    if a - q * d > 0 then q = q + 1 end
    return q
end
M.ceil_div = ceil_div

-- floor(a * b / d) and whether it has a remainder, exactly, for a < 2^53,
-- b <= 1e9, d <= 1e9: long division of a's base-10^4 digits times b.
local function muldiv(a, b, d)
    local digits, x = {}, a
    repeat
        table.insert(digits, 1, x % 10000)
        x = idiv(x, 10000)
    until x == 0
    local q, r = 0, 0
    for _, l in ipairs(digits) do
        local t = r * 10000 + l * b
        local qi = idiv(t, d)
        r = t - qi * d
        q = q * 10000 + qi
    end
    return q, r > 0
end
M.muldiv = muldiv

-- Non-negative integer from a decimal digit string below 2^53, else nil.
local function parse_uint(s)
    if type(s) ~= "string" or not s:match("^%d+$") then return nil end
    s = s:gsub("^0+(%d)", "%1")
    if #s > 16 then return nil end
    local v = tonumber(s)
    if v == nil or v >= MAXEXACT then return nil end
    return v
end
M.parse_uint = parse_uint

local function add(a, b)
    local r = a + b
    if r >= MAXEXACT then error("byte count over 2^53", 0) end
    return r
end

-- Exact product of two doubles as p + err (Dekker/Veltkamp, no FMA needed).
local function two_prod(a, b)
    a, b = a + 0.0, b + 0.0             -- Lua 5.3+: the split needs float rounding
    local p = a * b
    local t = 134217729 * a            -- 2^27 + 1
    local ah = t - (t - a)
    local al = a - ah
    t = 134217729 * b
    local bh = t - (t - b)
    local bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl
end

-- ceil(a * f) of the exact product (a integer < 2^53, f >= 0 a double).
local function ceil_mul(a, f)
    local p, err = two_prod(a, f)
    local c = math.ceil(p)
    if c == p and err > 0 then c = c + 1 end
    return c
end
M.ceil_mul = ceil_mul

local function split(s, sep)
    local out = {}
    for piece in (s .. sep):gmatch("(.-)" .. sep:gsub("%p", "%%%0")) do out[#out + 1] = piece end
    return out
end

------------------------------------------------------------------------------
-- Sizes (mm_parse_size of the C library, limited to 2^53 - 1).
------------------------------------------------------------------------------

local UNITS = {
    [""] = 1, b = 1, k = 1000, kb = 1000, m = 1000000, mb = 1000000,
    g = 1000000000, gb = 1000000000, t = 1000000000000, tb = 1000000000000,
    kib = KiB, mib = MiB, gib = GiB, tib = GiB * 1024,
}

-- "80GiB", "81559MiB", "1.5 TiB", "512 MB", "123" -> bytes, or nil and why.
-- The fraction's bytes are truncated; digits after the 9th are ignored.
function M.parse_size(s)
    if type(s) ~= "string" or s == "" then return nil, "empty size" end
    local lead, int, rest = s:match("^(%s*)(%d+)(.*)$")
    if not int then return nil, "'" .. s .. "' is not a size" end
    local frac = ""
    if rest:sub(1, 1) == "." then
        frac, rest = rest:match("^%.(%d*)(.*)$")
        if frac == "" then return nil, "'" .. s .. "' is not a size (digits expected after '.')" end
    end
    local unit, tail = rest:match("^%s*(%S*)(.*)$")
    if #unit > 7 or not tail:match("^%s*$") then return nil, "'" .. s .. "' is not a size (trailing characters)" end
    local mult = UNITS[unit:lower()]
    if not mult then return nil, "'" .. s .. "': unknown unit '" .. unit .. "'" end
    local w = parse_uint(int)
    if not w or w > MAXSIZE / mult then return nil, "size '" .. s .. "' is too large" end
    local v = w * mult
    frac = frac:sub(1, 9)
    if #frac > 0 then
        local fden, f = 10 ^ #frac, tonumber(frac)
        local q = muldiv(mult % fden, f, fden)
        v = v + idiv(mult, fden) * f + q
    end
    if v > MAXSIZE then return nil, "size '" .. s .. "' is too large" end
    return v, nil
end

-- "71.3 GiB", "512.0 MiB", "12 B" (mm_format_bytes)
function M.format_bytes(b)
    if b < 1024 then return istr(b) .. " B" end
    local units = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" }
    local v, i = b / 1024, 1
    while v >= 1024 and i < #units do v = v / 1024; i = i + 1 end
    return string.format("%.1f %s", v, units[i])
end

------------------------------------------------------------------------------
-- mmguard.conf, read exactly as the plugin reads it (spank_plugin/config.c):
-- the same keys, values, messages and the first error only.
------------------------------------------------------------------------------

M.BUILTIN_GPUS = {
    ["h100"] = 81559 * MiB, ["h200"] = 143771 * MiB, ["a100"] = 81920 * MiB,
    ["a100-40g"] = 40960 * MiB, ["l40s"] = 46068 * MiB,
}
local CONF_MAX_BYTES, CONF_MAX_LINE, MAX_GPU_TYPES = 65536, 1024, 32

local function default_conf()
    local gpus, n = {}, 0
    for k, v in pairs(M.BUILTIN_GPUS) do gpus[k] = v; n = n + 1 end
    return {
        action = "reject", flush = "warn", margin = { percent = 0, num = 0, den = 1, bytes = 0 }, reserve = 0,
        gpus = gpus, n_gpus = n, default_gpu = "h100", on_error = "reject", require = "off",
        max_gpus_per_node = 8, resize_types = {}, ctld_log = nil, log = nil, syslog = false, max_micro_batch = true,
        host_mem = "check", host_overhead = 3 * GiB, def_mem_per_node = 0, def_mem_per_cpu = 0,
        def_mem_per_gpu = 0, node_mem = 0,
    }
end
M.default_conf = default_conf

-- GPU type names as Slurm GRES types use them: [A-Za-z0-9_.-], 1..31 chars.
local function valid_gpu_name(s)
    return type(s) == "string" and #s >= 1 and #s <= 31 and s:match("^[%w_%.%-]+$") ~= nil
end

local BOOL = { yes = true, ["true"] = true, ["1"] = true, on = true,
               no = false, ["false"] = false, ["0"] = false, off = false }
local CHOICES = { action = { "reject", "warn", "resize" }, on_error = { "reject", "allow" },
                  require = { "off", "warn", "reject" }, host_mem = { "check", "warn", "off" },
                  flush = { "accept", "warn", "reject" } }
local SLURM_MEM_KEYS = { def_mem_per_node = true, def_mem_per_cpu = true, def_mem_per_gpu = true,
                         node_mem = true }

-- "7.5%": digits, one '.', at most 6 decimals, below 100 -> num, den (percent
-- = num / den), as the plugin keeps it.
local function percent(v)
    local int, dec = v:match("^(%d+)%.?(%d*)%%$")
    if not int or #dec > 6 or #int:gsub("^0+", "") > 2 then return nil end
    return tonumber(int .. dec), 10 ^ #dec
end

local function set_margin(conf, v, where)
    if v:sub(-1) == "%" then
        local num, den = percent(v)
        if not num then
            return where .. ": margin: invalid value '" .. v .. "': a percentage below 100 with at most 6 decimals (10%, 7.5%)"
        end
        conf.margin = { percent = tonumber(v:sub(1, -2)), num = num, den = den, bytes = 0 }
        return nil
    end
    local b, err = M.parse_size(v)
    if not b then return where .. ": margin: invalid value '" .. v .. "': " .. err end
    conf.margin = { percent = 0, num = 0, den = 1, bytes = b }
end

local function set_gpu(conf, key, v, where)
    local name = key:sub(5)
    if not valid_gpu_name(name) then return where .. ": " .. key .. ": invalid GPU type name '" .. name .. "'" end
    local b, err = M.parse_size(v)
    if not b then return where .. ": " .. key .. ": invalid size '" .. v .. "': " .. err end
    if b == 0 then return where .. ": " .. key .. ": GPU memory must be > 0" end
    name = name:lower()
    if not conf.gpus[name] then
        if conf.n_gpus >= MAX_GPU_TYPES then return where .. ": " .. key .. ": more than 32 GPU types" end
        conf.n_gpus = conf.n_gpus + 1
    end
    conf.gpus[name] = b
end

local function set_path(conf, key, v, where)
    if v == "" or v == "none" then conf[key] = nil; return nil end
    if v:sub(1, 1) ~= "/" then return where .. ": " .. key .. ": '" .. v .. "' is not an absolute path" end
    if #v >= 1024 then return where .. ": " .. key .. ": path longer than 1023 bytes" end
    if v:find("[%z\1-\31\127]") then return where .. ": " .. key .. ": control character in path" end
    conf[key] = v
end

local function set_resize_types(conf, v, where)
    if #v >= 256 then return where .. ": resize_types: list longer than 255 bytes" end
    local list = {}
    if v ~= "" then
        if v:sub(1, 1) == "," or v:sub(-1) == "," or v:find(",,", 1, true) then
            return where .. ": resize_types: empty entry in '" .. v .. "'"
        end
        for _, t in ipairs(split(v, ",")) do
            if not valid_gpu_name(t) then return where .. ": resize_types: invalid GPU type '" .. t .. "'" end
            list[#list + 1] = t:lower()
        end
    end
    conf.resize_types = list
end

-- def_mem_per_node / _cpu / _gpu, node_mem: slurm.conf's values (MiB there),
-- so a unit is required; none or 0 unsets (config.c's set_slurm_mem).
local function set_slurm_mem(conf, key, v, where)
    if v == "none" or v == "0" then conf[key] = 0; return nil end
    if v:match("%d$") then
        return where .. ": " .. key .. ": '" .. v .. "' needs a unit (slurm.conf counts in MiB: DefMemPerCPU=4000 is " .. v .. "MiB here)"
    end
    local b, err = M.parse_size(v)
    if not b then return where .. ": " .. key .. ": invalid size '" .. v .. "': " .. err end
    conf[key] = b
end

-- One key=value; nil, or the message "WHERE: KEY: problem".
local function set_key(conf, key, v, where)
    if CHOICES[key] then
        for _, c in ipairs(CHOICES[key]) do if v == c then conf[key] = v; return nil end end
        return where .. ": " .. key .. ": invalid value '" .. v .. "' (" .. table.concat(CHOICES[key], "|") .. ")"
    elseif key == "margin" then return set_margin(conf, v, where)
    elseif key == "reserve" or key == "host_overhead" then
        local b, err = M.parse_size(v)
        if not b then return where .. ": " .. key .. ": invalid size '" .. v .. "': " .. err end
        conf[key] = b
    elseif SLURM_MEM_KEYS[key] then return set_slurm_mem(conf, key, v, where)
    elseif key:sub(1, 4) == "gpu." then return set_gpu(conf, key, v, where)
    elseif key == "log" or key == "ctld_log" then return set_path(conf, key, v, where)
    elseif key == "resize_types" then return set_resize_types(conf, v, where)
    elseif key == "default_gpu" then
        if not valid_gpu_name(v) then return where .. ": default_gpu: invalid GPU type '" .. v .. "'" end
        conf.default_gpu = v:lower()
    elseif key == "syslog" or key == "max_micro_batch" then
        if BOOL[v] == nil then return where .. ": " .. key .. ": invalid value '" .. v .. "' (yes|no)" end
        conf[key] = BOOL[v]
    elseif key == "max_gpus_per_node" then
        local n = parse_uint(v)
        if not n or n < 1 or n > 1024 then
            return where .. ": max_gpus_per_node: '" .. v .. "' is not an integer in 1..1024"
        end
        conf.max_gpus_per_node = n
    elseif key == "config" then return where .. ": config: only allowed on the plugstack.conf line"
    else return where .. ": unknown key '" .. key .. "'" end
end

-- usable = mem - ceil(mem * percent / 100) - margin bytes - reserve, exactly
-- (mmg_config_usable), 0 if nothing is left.
function M.usable_bytes(mem, conf)
    local m = conf.margin
    local q, rem = muldiv(mem, m.num, 100 * m.den)
    local cut = q + (rem and 1 or 0)
    local u = mem - cut - m.bytes - conf.reserve
    if cut >= mem or u <= 0 then return 0 end
    return u
end

-- The cross-key checks (mmg_config_finish); the file name without a line.
local function finish_conf(conf, name)
    if not conf.gpus[conf.default_gpu] then
        return name .. ": default_gpu: unknown GPU type '" .. conf.default_gpu .. "' (add gpu." .. conf.default_gpu .. "=SIZE)"
    end
    for _, t in ipairs(conf.resize_types) do
        if not conf.gpus[t] then return name .. ": resize_types: unknown GPU type '" .. t .. "'" end
    end
    if conf.def_mem_per_cpu > 0 and conf.def_mem_per_node > 0 then
        return name .. ": def_mem_per_cpu: mutually exclusive with def_mem_per_node (as DefMemPerCPU and DefMemPerNode in slurm.conf)"
    end
    if M.usable_bytes(conf.gpus[conf.default_gpu], conf) == 0 then
        return name .. ": margin/reserve leave no usable memory on " .. conf.default_gpu
    end
end

local function ctrim(s)   -- config.c's trim(): blanks and tabs, a trailing CR
    return (s:gsub("^[ \t]+", ""):gsub("[ \t\r]+$", ""))
end

-- Parse mmguard.conf text.  Returns conf, or nil and the first error
-- ("FILE:LINE: KEY: problem"), as the plugin reports it.
function M.parse_conf(text, name)
    local conf, lineno = default_conf(), 0
    name = name or "mmguard.conf"
    if #text > CONF_MAX_BYTES then return nil, name .. ": config file larger than 65536 bytes" end
    if text:find("\0", 1, true) then return nil, name .. ": NUL byte in config file" end
    for raw in (text .. "\n"):gmatch("([^\n]*)\n") do
        lineno = lineno + 1
        local where = name .. ":" .. lineno
        if #raw >= CONF_MAX_LINE then return nil, where .. ": line longer than 1023 bytes" end
        local line = ctrim(raw)
        if line ~= "" and line:sub(1, 1) ~= "#" then
            local eq = line:find("=", 1, true)
            if not eq then return nil, where .. ": expected key=value, got '" .. line .. "'" end
            local key, v = ctrim(line:sub(1, eq - 1)), ctrim(line:sub(eq + 1))
            if key == "" then return nil, where .. ": empty key before '='" end
            local err = set_key(conf, key, v, where)
            if err then return nil, err end
        end
    end
    local err = finish_conf(conf, name)
    if err then return nil, err end
    return conf, nil
end

-- "10%+2147483648" (margin percent, then margin bytes + reserve), as the plugin writes it.
function M.margin_text(conf)
    return string.format("%g%%+%s", conf.margin.percent, istr(conf.margin.bytes + conf.reserve))
end

-- mmguard.conf next to this script (= next to slurm.conf); MMGUARD_CONF in
-- slurmctld's environment overrides it.
function M.conf_path()
    local p = os.getenv("MMGUARD_CONF")
    if p and p ~= "" then return p end
    local dir = SCRIPT_SOURCE:match("^@(.*)/[^/]*$")
    if dir and dir:sub(1, 1) == "/" then return dir .. "/mmguard.conf" end
    local conf = os.getenv("SLURM_CONF")
    dir = conf and conf:match("^(/.*)/[^/]*$")
    return (dir or "/etc/slurm") .. "/mmguard.conf"
end

-- conf, or nil and the error.
function M.load_conf(path)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, path .. ": cannot open config file: " .. tostring(err):gsub("^.-: ", "")
    end
    local text = f:read(CONF_MAX_BYTES + 1) or ""
    f:close()
    return M.parse_conf(text, path)
end

------------------------------------------------------------------------------
-- The MMGUARD variable the plugin publishes (spank_plugin/record.h):
-- "v=4 key=value ...", strings percent-encoded.
------------------------------------------------------------------------------

local REC_STR = { decision = 8, spec = 1024, sha256 = 65, model = 128, gpu = 32, request = 160,
                  error = 1024, admission = 160 }
local REC_NUM = { gpu_mem = true, usable = true, dp = true, peak = true, alloc = true, mmb = true,
                  host = true, ctx = true, nccl = true, afix = true, dp1 = true }
local REC_MODEL = { "ctx", "nccl", "afix", "afrac", "dp1", "terms", "res" }
local REC_ORDER = { "decision", "spec", "sha256", "model", "gpu", "gpu_mem", "usable", "dp",
                    "request", "peak", "alloc", "mmb", "host", "error", "admission", "ctx", "nccl",
                    "afix", "afrac", "dp1", "terms", "res", "cards" }
local REC_POINTS, MAX_DEGREE, REC_CARDS, REC_MAX = 64, 4294967295, 64, 16384
local VERDICTS = { fits = true, flushes = true, oom = true }

-- Percent-decode; nil for a stray '%', a control byte or too long a value.
local function decode(v, max)
    if v:gsub("%%%x%x", ""):find("%", 1, true) then return nil end
    local d = v:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
    if #d >= max or d:find("[\1-\31\127]") or d:find("\0", 1, true) then return nil end
    return d
end

local function encode(s)
    return (s:gsub("[^!-$&-~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function rec_value(m, k, v)
    if REC_STR[k] then
        m[k] = decode(v, REC_STR[k])
        if k == "decision" and m[k] ~= "accept" and m[k] ~= "warn" and m[k] ~= "error" then m[k] = nil end
        return m[k] ~= nil
    elseif REC_NUM[k] then
        m[k] = #v <= 20 and parse_uint(v) or nil
        return m[k] ~= nil
    elseif k == "afrac" then
        local f = v:match("^%d[%d%.eE+-]*$") and tonumber(v)
        if not f or f ~= f or f < 0 or f > 10 then return false end
        m.afrac = f + 0.0
        return true
    elseif k == "terms" then
        m.terms = {}
        for _, pair in ipairs(split(v, ",")) do
            local fs, ss = pair:match("^(%d+):(%d+)$")
            local F, S = parse_uint(fs), parse_uint(ss)
            if not F or not S or #m.terms >= 8 then return false end
            m.terms[#m.terms + 1] = { F, S }
        end
        return #m.terms > 0
    elseif k == "res" then
        -- "FROM-TO:RESERVED:PAGED[:ALLOCATED],...": ascending, disjoint degree
        -- ranges; ALLOCATED (>= 1) where the range's own sim gave it (dp.h)
        m.res = {}
        local after = 0
        for _, e in ipairs(split(v, ",")) do
            local a, b, r, p = e:match("^(%d+)-(%d+):(%d+):(%d+)$")
            local al
            if not a then a, b, r, p, al = e:match("^(%d+)-(%d+):(%d+):(%d+):(%d+)$") end
            local from, to, res, paged = parse_uint(a), parse_uint(b), parse_uint(r), parse_uint(p)
            local alloc = false
            if al then alloc = parse_uint(al) end
            if not (from and to and res and paged) or from < 1 or from > to or to > MAX_DEGREE
                or from <= after or #m.res >= REC_POINTS or alloc == nil or alloc == 0 then
                return false
            end
            m.res[#m.res + 1] = { from, to, res, paged, alloc }
            after = to
        end
        return #m.res > 0
    elseif k == "cards" then
        -- "TYPE:USABLE:N:KIND:RETRIES:PEAK,...": the plugin's verdict (mm_verdict_cards)
        -- for a GPU type at a count; (TYPE, N) unique, PEAK <= USABLE
        m.cards = {}
        for _, e in ipairs(split(v, ",")) do
            local t, u, n, kind, re, pk = e:match("^([%w_.-]+):(%d+):(%d+):(%l+):(%d+):(%d+)$")
            local usable, count, retries, peak = parse_uint(u), parse_uint(n), parse_uint(re), parse_uint(pk)
            if not (t and usable and count and retries and peak) or #t > 31 or not VERDICTS[kind]
                or count < 1 or count > MAX_DEGREE or peak > usable or #m.cards >= REC_CARDS
                or M.card(m, t, count) then
                return false
            end
            m.cards[#m.cards + 1] = { gpu = t, usable = usable, n = count, kind = kind,
                                      retries = retries, peak = peak }
        end
        return #m.cards > 0
    end
    return false
end

-- The published verdict for GPU type t (case-insensitive) at n GPUs, or nil.
function M.card(m, t, n)
    for _, c in ipairs(m.cards or {}) do
        if c.n == n and c.gpu:lower() == t:lower() then return c end
    end
    return nil
end

-- The record, or nil and why (the same checks as mmg_record_parse).
function M.parse_record(s)
    if type(s) ~= "string" then return nil, "MMGUARD missing" end
    if #s > REC_MAX then return nil, "MMGUARD: longer than " .. REC_MAX .. " bytes" end
    if s:sub(1, 3) ~= "v=4" or (#s > 3 and s:sub(4, 4) ~= " ") then
        return nil, "MMGUARD: unsupported version (want v=4)"
    end
    local m, seen, rest = {}, {}, s:sub(4)
    while rest ~= "" do
        local tok
        tok, rest = rest:match("^ ([^ ]*)(.*)$")
        if tok == "" then return nil, "MMGUARD: empty field" end
        local k, v = tok:match("^([^=]*)=(.*)$")
        if not (k and (REC_STR[k] or REC_NUM[k] or k == "afrac" or k == "terms" or k == "res"
                       or k == "cards")) then
            return nil, "MMGUARD: unknown field '" .. (k or tok):sub(1, 40) .. "'"
        end
        if seen[k] then return nil, "MMGUARD: duplicate field '" .. k .. "'" end
        seen[k] = true
        if not rec_value(m, k, v) then return nil, "MMGUARD: bad value of '" .. k .. "'" end
    end
    local nmodel = 0
    for _, k in ipairs(REC_MODEL) do if seen[k] then nmodel = nmodel + 1 end end
    if nmodel ~= 0 and nmodel ~= #REC_MODEL then return nil, "MMGUARD: incomplete peak model" end
    m.has_model = nmodel == #REC_MODEL
    return m, nil
end

-- The text of a record (after a resize).
function M.format_record(m)
    local parts = { "v=4" }
    for _, k in ipairs(REC_ORDER) do
        local v = m[k]
        if k == "terms" and v then
            local t = {}
            for i, p in ipairs(v) do t[i] = istr(p[1]) .. ":" .. istr(p[2]) end
            v = table.concat(t, ",")
        elseif k == "res" and v then
            local t = {}
            for i, p in ipairs(v) do
                t[i] = istr(p[1]) .. "-" .. istr(p[2]) .. ":" .. istr(p[3]) .. ":" .. istr(p[4])
                    .. (p[5] and (":" .. istr(p[5])) or "")   -- a per-degree point's allocated peak
            end
            v = table.concat(t, ",")
        elseif k == "cards" and v then
            local t = {}
            for i, c in ipairs(v) do
                t[i] = table.concat({ c.gpu, istr(c.usable), istr(c.n), c.kind, istr(c.retries), istr(c.peak) }, ":")
            end
            v = table.concat(t, ",")
        elseif k == "afrac" and v then
            v = string.format("%.17g", v)
        elseif REC_STR[k] and v and v ~= "" then
            v = encode(v)
        elseif REC_NUM[k] and v then
            v = istr(v)
        end
        local model_key = false
        for _, mk in ipairs(REC_MODEL) do model_key = model_key or mk == k end
        if v and v ~= "" and (model_key or k == "mmb" or not (REC_NUM[k] and v == "0")) then
            parts[#parts + 1] = k .. "=" .. v
        end
    end
    return table.concat(parts, " ")
end

-- mm_peak_for_dp() of the C library from the published model:
--   allocated(1) = dp1, allocated(N >= 2) = max_k (F_k + ceil(S_k / N))
--   peak(N) = ceil(allocated * (1 + afrac)) + afix + (max(R, allocated) - allocated)
--             + ctx + (N > 1 ? nccl : 0) + P
-- with R, P of the res range that holds N (the allocator model replayed at N),
-- and that range's own allocated peak in place of the terms where it has one;
-- nil for an N no range holds: the record does not say, and nothing is guessed.
-- (here the product is exact; the C code rounds it in long double).
function M.alloc_for_dp(m, n)
    if n == 1 then return m.dp1 end
    local best = 0
    for _, t in ipairs(m.terms) do
        local a = add(t[1], ceil_div(t[2], n))
        if a > best then best = a end
    end
    return best
end

function M.peak_for_dp(m, n)
    assert(is_int(n) and n >= 1, "N must be an integer >= 1")
    local point
    for _, p in ipairs(m.res) do
        if p[1] <= n and n <= p[2] then point = p end
    end
    if not point then return nil end
    local alloc = point[5] or M.alloc_for_dp(m, n)
    local peak = add(alloc, ceil_mul(alloc, m.afrac))
    local slack = point[3] > alloc and point[3] - alloc or 0
    peak = add(add(add(peak, m.afix), slack), m.ctx)
    if n > 1 then peak = add(peak, m.nccl) end
    return add(peak, point[4])
end

------------------------------------------------------------------------------
-- The job's GPU request (22.05 job_desc fields), evaluated exactly as the
-- plugin's mmg_jobreq_eval() (spank_plugin/request.c) evaluates the request it
-- rebuilds in sbatch: tests/unit/request_cases.txt drives both.
------------------------------------------------------------------------------

-- One tres entry "gres:gpu:h100:2" (prefix optional): gpu, gpu:COUNT,
-- gpu:TYPE, gpu:TYPE:COUNT.  true, type|nil, count for a GPU entry; false for
-- another GRES; nil when unreadable.
local function gpu_entry(e)
    e = e:gsub("^gres[:/]", "", 1)
    if e:sub(1, 3) ~= "gpu" or (#e > 3 and e:sub(4, 4) ~= ":") then return false end
    if #e == 3 then return true, nil, 1 end
    local rest = e:sub(5)
    local a, b = rest:match("^([^:]*):(.*)$")
    if not a then
        if rest:match("^%d") then
            local n = rest:match("^%d+$") and #rest < 16 and parse_uint(rest)
            if not n or n > 4294967295 then return nil end
            return true, nil, n
        end
        a = rest
    else
        b = b:match("^%d+$") and #b < 16 and parse_uint(b)
        if not b or b > 4294967295 then return nil end
    end
    if not valid_gpu_name(a) then return nil end
    return true, a:lower(), b or 1
end

-- The GPU entry of a tres string: 1, type, count; 0 none; -1, message.
function M.tres_gpu(tres)
    local found, gtype, count = 0, nil, nil
    if type(tres) ~= "string" or tres == "" then return 0 end
    for _, e in ipairs(split(tres, ",")) do
        local is_gpu, t, n = gpu_entry(e)
        if is_gpu == nil then return -1, "cannot read the GPU request '" .. tres .. "'" end
        if is_gpu then
            if found == 1 then return -1, "more than one GPU entry in '" .. tres .. "'" end
            found, gtype, count = 1, t, n
        end
    end
    return found, gtype, count
end

local function given(v, unset)   -- a job_desc number that was set
    if type(v) ~= "number" or v == unset or v == NO_VAL or v == INFINITE or v <= 0 then return nil end
    return v
end

local function node_range(j)
    local minn, maxn = given(j.min_nodes), given(j.max_nodes)
    local tasks, tpn = given(j.num_tasks), given(j.ntasks_per_node, NO_VAL16)
    if minn then return minn, (maxn and maxn >= minn) and maxn or minn end
    if tasks and tpn then
        local n = ceil_div(tasks, tpn)
        return n, n
    end
    return 1, (tasks and tasks > 1) and tasks or 1
end

-- What the job asks for: {kind="node"|"job"|"task", type, count, nodes_min,
-- nodes_max, tasks, gpus}; or nil, "none"|"unknown", why.
function M.eval_request(j)
    local fields = { { "tres_per_node", "per node", "node" }, { "tres_per_job", "per job", "job" },
                     { "tres_per_task", "per task", "task" }, { "tres_per_socket", "per socket", "socket" } }
    local req, which
    for _, f in ipairs(fields) do
        local rc, t, n = M.tres_gpu(j[f[1]])
        if rc < 0 then return nil, "unknown", t end
        if rc == 1 and n > 0 then
            if req then return nil, "unknown", "GPUs asked for both " .. which[2] .. " and " .. f[2] end
            req, which = { kind = f[3], type = t, count = n }, f
        end
    end
    if not req then return nil, "none", "the job asks for no GPU" end
    if req.kind == "socket" then
        return nil, "unknown", "GPUs per socket (--gpus-per-socket) are not supported: the GPU count depends on the sockets Slurm picks"
    end
    req.nodes_min, req.nodes_max = node_range(j)
    if req.kind == "task" then
        local minn, tpn = given(j.min_nodes), given(j.ntasks_per_node, NO_VAL16)
        req.tasks = given(j.num_tasks) or (minn and minn * (tpn or 1))
        if not req.tasks then return nil, "unknown", "GPUs per task without a task count (-n)" end
    end
    req.gpus = M.request_total(req, req.nodes_min)
    if req.gpus > MAX_GPUS then return nil, "unknown", "the job asks for more than 65536 GPUs" end
    return req
end

function M.request_total(req, nodes)
    if req.kind == "job" then return req.count end
    if req.kind == "task" then return req.count * req.tasks end
    return req.count * nodes
end

------------------------------------------------------------------------------
-- Host memory: what the busiest GPU node of the job gets, from the 22.05
-- job_desc fields (min_mem_per_node, min_mem_per_cpu: exact where the raw
-- pn_min_memory with its MEM_PER_CPU bit 2^63 is not, in a double; mem_per_tres
-- "gres:gpu:MB"; cpus_per_task, cpus_per_tres, pn_min_cpus) and the site's
-- defaults.  The twin of the plugin's mmg_mem_eval() (spank_plugin/memreq.c):
-- the "mem" cases of tests/unit/request_cases.txt drive both.
------------------------------------------------------------------------------

local MB = MiB                     -- Slurm's MB is 2^20 bytes

-- min(a * b, 2^53 - 1): a request that large holds anything (both readers).
local function sat(a, b)
    if a == 0 or b == 0 then return 0 end
    if a > idiv(MAXSIZE, b) then return MAXSIZE end
    return a * b
end

-- "gres:gpu:N" (mem_per_tres, cpus_per_tres) -> N, else nil.
local function gpu_tres_value(s)
    if type(s) ~= "string" then return nil end
    for _, e in ipairs(split(s, ",")) do
        local n = e:gsub("^gres[:/]", "", 1):match("^gpu:(%d+)$")
        if n then return parse_uint(n) end
    end
    return nil
end

-- The memory fields of job_desc: {node=MB|nil, cpu=MB|nil, gpu=MB|nil, cpt, cpg, mincpus}.
function M.mem_fields(j)
    local function mb(v) return type(v) == "number" and v >= 0 and v < 2 ^ 63 and v or nil end
    return { node = mb(j.min_mem_per_node), cpu = mb(j.min_mem_per_cpu),
             gpu = gpu_tres_value(j.mem_per_tres), cpt = given(j.cpus_per_task, NO_VAL16),
             cpg = gpu_tres_value(j.cpus_per_tres), mincpus = given(j.pn_min_cpus, NO_VAL16) }
end

-- GPUs on the busiest node (memreq.c busiest_ranks) and the CPUs it gets at least.
local function busiest(j, req, maxgpn)
    local nodes, ntpn, ranks = req.nodes_min, given(j.ntasks_per_node, NO_VAL16)
    if req.kind == "node" then ranks = req.count
    elseif req.kind == "task" and ntpn then ranks = req.count * ntpn
    elseif nodes <= 1 then ranks = req.gpus
    else
        local even = ceil_div(req.gpus, nodes)
        local rest = req.gpus > nodes - 1 and req.gpus - (nodes - 1) or 1
        if maxgpn and rest > maxgpn then rest = maxgpn end
        ranks = math.max(rest, even)
    end
    return ranks
end

local function node_cpus(j, req, f, ranks)
    local ntpn, ntasks, tasks = given(j.ntasks_per_node, NO_VAL16), given(j.num_tasks), 1
    if ntpn then tasks = ntpn
    elseif req.kind == "task" then tasks = idiv(ranks, req.count)
    elseif ntasks then tasks = idiv(ntasks, req.nodes_min) end
    if tasks == 0 then tasks = 1 end
    return math.max(tasks * (f.cpt or 1), (f.cpg or 0) * ranks, f.mincpus or 0)
end

-- What the node gets: "sized", n | "whole", n (the whole node, node_mem not
-- set); n = {kind = node|cpu|gpu|whole, from_default, per_mb, ranks, cpus, have}.
function M.host_request(j, req, site)
    local f = M.mem_fields(j)
    local n = { ranks = busiest(j, req, site.max_gpus_per_node), from_default = false }
    n.cpus = node_cpus(j, req, f, n.ranks)
    if f.node or f.cpu then
        n.kind, n.per_mb = f.node and "node" or "cpu", f.node or f.cpu
        n.have = sat(n.per_mb, MB)
        if n.kind == "cpu" then n.have = sat(n.have, n.cpus) end
    elseif f.gpu and f.gpu > 0 then
        n.kind, n.per_mb, n.have = "gpu", f.gpu, sat(sat(f.gpu, MB), n.ranks)
    else
        n.from_default = true
        if site.def_mem_per_gpu > 0 then
            n.kind, n.per_mb, n.have = "gpu", idiv(site.def_mem_per_gpu, MB), sat(site.def_mem_per_gpu, n.ranks)
        elseif site.def_mem_per_cpu > 0 then
            n.kind, n.per_mb, n.have = "cpu", idiv(site.def_mem_per_cpu, MB), sat(site.def_mem_per_cpu, n.cpus)
        else
            n.kind, n.per_mb, n.have = "node", idiv(site.def_mem_per_node, MB), site.def_mem_per_node
        end
    end
    if n.have > 0 then return "sized", n end
    n.kind = "whole"
    if site.node_mem == 0 then return "whole", n end
    n.have = site.node_mem
    return "sized", n
end

-- The request that holds `need` bytes, in the kind's unit (memreq.c mmg_mem_ask):
-- MB, and its text ("160G", "900M").
function M.mem_ask(n, need)
    local div = 1
    if not n.from_default and n.kind == "cpu" then div = math.max(n.cpus, 1)
    elseif not n.from_default and n.kind == "gpu" then div = math.max(n.ranks, 1) end
    local mb = ceil_div(ceil_div(need, div), MB)
    if mb >= 1024 then
        local g = ceil_div(mb, 1024)
        return g * 1024, istr(g) .. "G"
    end
    return mb, istr(mb) .. "M"
end

-- "h100:2x1-1/node": the plugin's request field, for comparing the two.
function M.request_code(req)
    local t = req.type or "gpu"
    if req.kind == "job" then return string.format("%s:%s/job", t, istr(req.count)) end
    if req.kind == "task" then return string.format("%s:%sx%s/task", t, istr(req.count), istr(req.tasks)) end
    return string.format("%s:%sx%s-%s/node", t, istr(req.count), istr(req.nodes_min), istr(req.nodes_max))
end

-- One tres string as a list (for resize): GPU entries {gpu=true, prefix,
-- type, count}, others {text}.
function M.parse_tres(s)
    local out = {}
    if s == nil or s == "" then return out end
    for _, item in ipairs(split(s, ",")) do
        local is_gpu, t, n = gpu_entry(item)
        if is_gpu then
            out[#out + 1] = { gpu = true, prefix = item:match("^(gres[:/])") or "", type = t, count = n }
        else
            out[#out + 1] = { text = item }
        end
    end
    return out
end

function M.format_tres(list)
    local parts = {}
    for _, e in ipairs(list) do
        if e.gpu then
            if e.type then
                parts[#parts + 1] = string.format("%sgpu:%s:%s", e.prefix, e.type, istr(e.count))
            else
                parts[#parts + 1] = string.format("%sgpu:%s", e.prefix, istr(e.count))
            end
        else
            parts[#parts + 1] = e.text
        end
    end
    return table.concat(parts, ",")
end
local function short_gpu(type_, count)
    if type_ then return string.format("gpu:%s:%s", type_, istr(count)) end
    return "gpu:" .. istr(count)
end

------------------------------------------------------------------------------
-- JSON (no library in Debian's lua5.3): strings, integers, floats, booleans.
------------------------------------------------------------------------------

local ESC = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
              ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }

-- Replace invalid UTF-8 (stray bytes, overlongs, surrogates, > U+10FFFF) by
-- U+FFFD so that the output is valid JSON (RFC 3629 table of well-formed bytes).
local function utf8_seq_len(s, i)
    local c = s:byte(i)
    if c < 0x80 then return 1 end
    local len, lo, hi
    if c >= 0xC2 and c <= 0xDF then len, lo, hi = 2, 0x80, 0xBF
    elseif c == 0xE0 then len, lo, hi = 3, 0xA0, 0xBF
    elseif c == 0xED then len, lo, hi = 3, 0x80, 0x9F
    elseif c >= 0xE1 and c <= 0xEF then len, lo, hi = 3, 0x80, 0xBF
    elseif c == 0xF0 then len, lo, hi = 4, 0x90, 0xBF
    elseif c >= 0xF1 and c <= 0xF3 then len, lo, hi = 4, 0x80, 0xBF
    elseif c == 0xF4 then len, lo, hi = 4, 0x80, 0x8F
    else return nil end
    local b = s:byte(i + 1)
    if not b or b < lo or b > hi then return nil end
    for j = i + 2, i + len - 1 do
        b = s:byte(j)
        if not b or b < 0x80 or b > 0xBF then return nil end
    end
    return len
end

local function utf8_clean(s)
    if not s:find("[\128-\255]") then return s end
    local out, i, n = {}, 1, #s
    while i <= n do
        local len = utf8_seq_len(s, i)
        if len then out[#out + 1] = s:sub(i, i + len - 1); i = i + len
        else out[#out + 1] = "\239\191\189"; i = i + 1 end
    end
    return table.concat(out)
end

function M.json_string(s)
    s = utf8_clean(tostring(s))
    return '"' .. s:gsub('[%c"\\\127]', function(c)
        return ESC[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
end

local function json_value(v)
    local t = type(v)
    if v == nil then return "null"
    elseif t == "table" and v.raw then return v.raw
    elseif t == "boolean" then return v and "true" or "false"
    elseif t == "number" then
        if v ~= v or v == math.huge or v == -math.huge then return "null" end
        if is_int(v) then return istr(v) end
        return string.format("%.17g", v)
    else return M.json_string(v) end
end

-- A double as json-c writes one: always with a fraction or exponent ("5.0").
function M.json_double(v)
    local t = string.format("%.17g", v)
    if tonumber(string.format("%.15g", v)) == v then t = string.format("%.15g", v) end
    if not t:find("[%.eEn]") then t = t .. ".0" end
    return t
end

-- fields: list of {key, value} so that the output order is stable.
function M.json_object(fields)
    local parts = {}
    for _, kv in ipairs(fields) do
        parts[#parts + 1] = M.json_string(kv[1]) .. ":" .. json_value(kv[2])
    end
    return "{" .. table.concat(parts, ",") .. "}"
end


------------------------------------------------------------------------------
-- Logs: slurmctld's own (slurm.log_*) and the JSON-lines ctld_log.
------------------------------------------------------------------------------

function M.log_error(msg)
    if slurm and slurm.log_error then slurm.log_error("%s", msg) end
end
function M.log_info(msg)
    if slurm and slurm.log_info then slurm.log_info("%s", msg) end
end
local function log_user(msg)
    if slurm and slurm.log_user then slurm.log_user("%s", msg) end
end

-- lua-posix, when installed: the ctld_log is opened like the plugin's log.
local function posix()
    local ok, p = pcall(function()
        return { fcntl = require("posix.fcntl"), unistd = require("posix.unistd"),
                 stat = require("posix.sys.stat"), uname = require("posix.sys.utsname") }
    end)
    return ok and p or nil
end

-- O_NOFOLLOW: lua-posix 33 lacks the constant; it is 0400000 on x86_64 and
-- aarch64 (Linux asm-generic), the only architectures it is assumed on.
local function nofollow(P)
    if P.fcntl.O_NOFOLLOW then return P.fcntl.O_NOFOLLOW end
    local m = P.uname.uname().machine
    if m == "x86_64" or m == "aarch64" then return 131072 end
end

-- Append one line to path without following a symlink in its place and
-- without blocking on a FIFO; regular files only.  true, or nil and why.
function M.append_log(path, line)
    local P = posix()
    if not P then return nil, "lua-posix is not installed (Debian: lua-posix), so the log cannot be opened safely" end
    local nf = nofollow(P)
    if not nf then return nil, "O_NOFOLLOW unknown on this architecture" end
    local st = P.stat.lstat(path)
    if st and P.stat.S_ISLNK(st.st_mode) ~= 0 then return nil, "it is a symbolic link (not followed)" end
    local F = P.fcntl
    local fd, err = F.open(path, F.O_WRONLY + F.O_APPEND + F.O_CREAT + F.O_NONBLOCK + F.O_CLOEXEC + nf, 416)
    if not fd then return nil, tostring(err):gsub("^.-: ", "") end
    st = P.stat.lstat(path)
    if not st or P.stat.S_ISREG(st.st_mode) == 0 then
        P.unistd.close(fd)
        return nil, "not a regular file"
    end
    local n = P.unistd.write(fd, line)
    P.unistd.close(fd)
    if n ~= #line then return nil, "short write" end
    return true
end

local reported = {}
local function write_log(conf, fields)
    if not conf.ctld_log then return end
    local ok, why = M.append_log(conf.ctld_log, M.json_object(fields) .. "\n")
    if not ok and not reported[conf.ctld_log .. why] then
        reported[conf.ctld_log .. why] = true   -- once per problem, not per job
        M.log_error("mmguard: ctld_log=" .. conf.ctld_log .. ": cannot append the decision record: " .. why)
    end
end

------------------------------------------------------------------------------
-- Decision.
------------------------------------------------------------------------------

local function time_limit_minutes(job_desc, part_list)
    local tl = job_desc.time_limit
    if tl and tl ~= NO_VAL and tl ~= INFINITE and tl > 0 then return tl end
    if type(part_list) ~= "table" then return nil end
    local part
    local pname = job_desc.partition
    if pname and pname ~= "" then
        part = part_list[(split(pname, ","))[1]]
    else
        for _, p in pairs(part_list) do
            if p.flag_default == 1 or p.flag_default == true then part = p; break end
        end
    end
    if not part then return nil end
    for _, k in ipairs({ "default_time", "max_time" }) do
        local v = part[k]
        if v and v ~= NO_VAL and v ~= INFINITE and v > 0 then return v end
    end
    return nil
end

-- The MMGUARD value in the job's SPANK environment (0-indexed: pairs).
local function spank_record(job_desc)
    local env = job_desc.spank_job_env
    if type(env) ~= "table" then return nil end
    for _, kv in pairs(env) do
        if type(kv) == "string" and kv:sub(1, 8) == "MMGUARD=" then return kv:sub(9) end
    end
    return nil
end
M.spank_record = spank_record

local function asks_for_gpus(job_desc)
    for _, f in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket" }) do
        local rc, _, n = M.tres_gpu(job_desc[f])
        if rc < 0 or (rc == 1 and n > 0) then return true end
    end
    return false
end

-- A decision in progress: the log record and how to end it.
local function new_ctx(job_desc, part_list, conf)
    local SUCCESS, ERROR = (slurm and slurm.SUCCESS) or 0, (slurm and slurm.ERROR) or -1
    local nodes = given(job_desc.min_nodes)
    return { job = job_desc, conf = conf or default_conf(), SUCCESS = SUCCESS, ERROR = ERROR, rec = {
        time = os.date("!%Y-%m-%dT%H:%M:%SZ"), user = job_desc.user_name, uid = job_desc.user_id,
        job_name = job_desc.name, source = "slurmctld", nodes = nodes,
        time_limit_minutes = time_limit_minutes(job_desc, part_list) } }
end

local function finish(ctx, decision, reason, rc)
    local r, conf = ctx.rec, ctx.conf
    r.decision, r.reason = decision, reason
    write_log(conf, {
        { "time", r.time }, { "source", r.source }, { "decision", decision }, { "reason", reason },
        { "action", conf.action }, { "require", conf.require }, { "user", r.user }, { "uid", r.uid },
        { "job_name", r.job_name }, { "spec", r.spec }, { "spec_sha256", r.spec_sha256 },
        { "model", r.model }, { "gpu", r.gpu }, { "gpu_mem_bytes", r.gpu_mem }, { "gpus", r.gpus },
        { "nodes", r.nodes }, { "data_parallel", r.gpus }, { "request", r.request },
        { "plugin_data_parallel", r.plugin_dp }, { "plugin_request", r.plugin_request },
        { "peak_bytes", r.peak }, { "usable_bytes", r.usable }, { "verdict", r.verdict },
        { "alloc_retries_per_step", r.retries }, { "card_peak_bytes", r.card_peak },
        { "verdict_data_parallel", r.verdict_dp }, { "flush", r.verdict and conf.flush or nil },
        { "margin", { raw = M.json_object({ { "percent", { raw = M.json_double(conf.margin.percent) } },
            { "bytes", conf.margin.bytes }, { "reserve_bytes", conf.reserve },
            { "text", M.margin_text(conf) } }) } },
        { "time_limit_minutes", r.time_limit_minutes }, { "requested_tres", r.requested_tres },
        { "new_tres", r.new_tres }, { "new_gpu", r.new_gpu }, { "new_gpus", r.new_gpus },
        { "new_peak_bytes", r.new_peak }, { "new_usable_bytes", r.new_usable },
        { "new_verdict", r.new_verdict },
        { "host", r.host and { raw = M.json_object(r.host) } or nil },
    })
    M.log_info(string.format("mmguard: job %s uid %s: %s: %s", tostring(r.job_name), tostring(r.uid),
        decision, reason))
    return rc
end

-- Cannot decide: on_error.
local function fail(ctx, reason)
    M.log_error("mmguard: " .. reason)
    if ctx.conf.on_error == "allow" then
        return finish(ctx, "error", reason .. " (on_error=allow: job accepted)", ctx.SUCCESS)
    end
    log_user("mmguard: job rejected: " .. reason ..
        " (on_error=reject; contact your administrator or resubmit without --mm-model)")
    return finish(ctx, "error", reason .. " (on_error=reject)", ctx.ERROR)
end

-- A broken mmguard.conf refuses --mm-model jobs whatever it says about
-- on_error (that line may be the broken one), as the plugin does.
local function broken_conf(ctx, err)
    M.log_error("mmguard: configuration error: " .. err)
    log_user("mmguard: job rejected: mmguard configuration error: " .. err ..
        " (contact your administrator or resubmit without --mm-model)")
    return finish(ctx, "error", "configuration error: " .. err, ctx.ERROR)
end

-- require= for a job without --mm-model (the plugin published nothing).
function M.no_model(job_desc, part_list)
    local SUCCESS, ERROR = (slurm and slurm.SUCCESS) or 0, (slurm and slurm.ERROR) or -1
    if not asks_for_gpus(job_desc) then return SUCCESS end
    local conf, err = M.load_conf(M.conf_path())
    if not conf then
        M.log_error("mmguard: configuration error (require= not applied): " .. err)
        return SUCCESS
    end
    if conf.require == "off" then return SUCCESS end
    local ctx = new_ctx(job_desc, part_list, conf)
    ctx.rec.requested_tres = job_desc.tres_per_node or job_desc.tres_per_job or job_desc.tres_per_task
    local why = "GPU job without --mm-model (require=" .. conf.require ..
        "): add --mm-model=SPEC so that its peak GPU memory is checked"
    if conf.require == "warn" then
        log_user("mmguard: WARNING: " .. why)
        return finish(ctx, "warn", why, SUCCESS)
    end
    log_user("mmguard: job rejected: " .. why)
    return finish(ctx, "reject", why, ERROR)
end

-- Core of the script: returns rc (slurm.SUCCESS/ERROR).
function M.submit(job_desc, part_list, submit_uid)
    local text = spank_record(job_desc)
    if not text then return M.no_model(job_desc, part_list) end
    local conf, err = M.load_conf(M.conf_path())
    local ctx = new_ctx(job_desc, part_list, conf)
    if not conf then return broken_conf(ctx, err) end
    local ok, rc = pcall(M.decide, ctx, text)
    if ok then return rc end
    return fail(ctx, "internal error: " .. tostring(rc))
end

local function gpu_text(t, n)    -- "gpu:h100:2"
    if t then return string.format("gpu:%s:%s", t, istr(n)) end
    return "gpu:" .. istr(n)
end

-- "2 GPUs (gres:gpu:h100:2 on 1 node)"
local function describe(req, tres)
    local shape = ""
    if req.kind == "node" then
        shape = req.nodes_max > req.nodes_min and string.format(" on %s-%s nodes", istr(req.nodes_min), istr(req.nodes_max))
            or string.format(" on %s node%s", istr(req.nodes_min), req.nodes_min == 1 and "" or "s")
    elseif req.kind == "task" then
        shape = " x " .. istr(req.tasks) .. " tasks"
    end
    return string.format("%s GPU%s (%s%s)", istr(req.gpus), req.gpus == 1 and "" or "s", tres, shape)
end

-- The published verdict for `gtype` at n GPUs with this site's usable memory:
-- the card, or nil and why.  A verdict the plugin made for another usable
-- (a different mmguard.conf on the submit host) is not used.
local function card_at(m, gtype, n, usable)
    local c = M.card(m, gtype, n)
    if not c then
        return nil, "the submit-time check has no verdict for " .. istr(n) .. " GPUs of " .. gtype
            .. " (the caching allocator is replayed only at the cards and counts it was asked for)"
    end
    if c.usable ~= usable then
        return nil, string.format("the submit-time check judged %s with %s usable, mmguard.conf here gives %s",
            gtype, M.format_bytes(c.usable), M.format_bytes(usable))
    end
    return c
end
M.card_at = card_at

local RANK = { fits = 0, flushes = 1, oom = 2 }
-- a worse than b, as the plugin's worse(): out of memory, flushes, more
-- retries, a higher peak
local function worse(a, b)
    if a.kind ~= b.kind then return RANK[a.kind] > RANK[b.kind] end
    if a.retries ~= b.retries then return a.retries > b.retries end
    return a.peak > b.peak
end

-- Runs as the site's flush= allows: fits, or fits with cache flushes unless
-- flush=reject.
function M.acceptable(c, conf)
    return c.kind == "fits" or (c.kind == "flushes" and conf.flush ~= "reject")
end

-- The verdict for the request; a node range starting at one GPU also at the
-- next total (1 -> 2 GPUs adds NCCL), the worse of the two, as the plugin
-- does.  nil and why when the record does not cover it.
local function judged_card(m, req, gtype, usable)
    local c, why = card_at(m, gtype, req.gpus, usable)
    if not c then return nil, why end
    local at = req.gpus
    if req.kind == "node" and req.nodes_max > req.nodes_min and req.gpus == 1 then
        local n2 = M.request_total(req, req.nodes_min + 1)
        local c2, why2 = card_at(m, gtype, n2, usable)
        if not c2 then return nil, why2 end
        if worse(c2, c) then c, at = c2, n2 end
    end
    return c, at
end

-- The smallest per-node count of `gtype` (from `from`) whose verdict the
-- site accepts (only counts the record covers).
local function first_fit(m, req, from, gtype, usable, maxn, conf)
    for g = from, maxn do
        local c = card_at(m, gtype, g * req.nodes_min, usable)
        if c and M.acceptable(c, conf) then return g, c end
    end
end

-- The GPU processes' host memory against the job's memory request (the
-- plugin's hostmem.c): {reason, hint, block = reject, warn = warn, log = the
-- ctld_log "host" object}.  The per-process host bytes were predicted at the
-- plugin's N (m.dp) and are F + S / dp: offloaded optimizer states and
-- parameters S are partitioned over the ranks, offloaded activations F are
-- each rank's own.  The record has only their sum, so at another N this takes
-- the bound that holds whatever the split: host (N > dp: it only shrinks) or
-- ceil(host * dp / N) (N < dp: it grows at most that much); exact at N = dp.
local HOST_FLAG = { node = "--mem", cpu = "--mem-per-cpu", gpu = "--mem-per-gpu", whole = "--mem" }
local HOST_DEFKEY = { node = "def_mem_per_node", cpu = "def_mem_per_cpu", gpu = "def_mem_per_gpu" }

local function host_request_text(n)
    local count = n.kind == "cpu" and n.cpus or n.ranks
    local unit = string.format(" x %s %s%s", istr(count), n.kind == "cpu" and "CPU" or "GPU", count == 1 and "" or "s")
    if n.kind == "whole" then
        return "a whole node: " .. (n.from_default and "no --mem and no def_mem_* default" or "--mem=0") ..
            ", node_mem in mmguard.conf"
    elseif n.from_default then
        return string.format("no --mem: the site's %s=%s%s", HOST_DEFKEY[n.kind], M.format_bytes(n.per_mb * MB),
            n.kind == "node" and "" or unit)
    end
    local what = string.format("%s=%sM", HOST_FLAG[n.kind], istr(n.per_mb))
    if n.kind == "node" then return what end
    return what .. unit
end

function M.host_check(job, m, req, conf)
    if conf.host_mem == "off" or not m.dp then return {} end
    local per_rank = m.host or 0
    if req.gpus < m.dp and per_rank > 0 then
        local q, rem = muldiv(per_rank, m.dp, req.gpus)
        per_rank = q + (rem and 1 or 0)
    end
    local st, n = M.host_request(job, req, conf)
    local need = add(0, n.ranks * add(per_rank, conf.host_overhead))
    local log = { { "result", "unchecked" }, { "peak_bytes_per_process", per_rank },
                  { "overhead_bytes", conf.host_overhead }, { "processes", n.ranks },
                  { "need_bytes", need }, { "have_bytes", nil } }
    local h = { log = log }
    if st == "whole" then return h end
    local _, ask = M.mem_ask(n, need)
    local reqtext = host_request_text(n)
    log[1][2], log[6][2] = need <= n.have and "fits" or "misfit", n.have
    log[#log + 1], log[#log + 2] = { "request", reqtext }, { "ask", ask }
    local text = string.format("predicted host memory %s per node (%s GPU process%s x (%s offloaded + %s runtime))",
        M.format_bytes(need), istr(n.ranks), n.ranks == 1 and "" or "es", M.format_bytes(per_rank),
        M.format_bytes(conf.host_overhead))
    if need <= n.have then return h end
    h.reason = string.format("%s does not fit the %s the job gets (%s)", text, M.format_bytes(n.have), reqtext)
    h.hint = n.kind == "whole" and "fewer GPU processes per node (more nodes) or less CPU offload"
        or ((n.from_default and "--mem" or HOST_FLAG[n.kind]) .. "=" .. ask)
    h.block = conf.host_mem == "check" and conf.action ~= "warn"
    h.warn = not h.block
    return h
end

-- What the verdict says, in the plugin's words (check.c verdict_reason):
-- the card's peak (the caching allocator capped at the card, plus the CUDA
-- context and NCCL; for out of memory the uncapped model's peak).
-- the uncapped model's peak at n, nil when the record has no model or no
-- replay at n
local function model_peak(m, n)
    return m.has_model and M.peak_for_dp(m, n) or nil
end

-- "3 cudaMalloc retries per step" (retries in the first step only: 0 per step)
local function retries_text(c)
    if c.retries == 0 then return "cudaMalloc retries in the first step only" end
    return string.format("%s cudaMalloc retr%s per step", istr(c.retries), c.retries == 1 and "y" or "ies")
end

local function verdict_text(m, c, gtype, usable, mem, desc, at, n)
    local oom = c.kind == "oom"
    local peak = oom and model_peak(m, at) or c.peak
    local t = string.format("predicted peak %s per GPU %s %s (%s usable of %s) with %s",
        M.format_bytes(peak), oom and "does not fit" or "fits", gtype, M.format_bytes(usable),
        M.format_bytes(mem), desc)
    if c.kind == "flushes" then
        t = t .. " only with cache flushes (" .. retries_text(c) .. ")"
    elseif oom then
        t = t .. ": out of memory"
    end
    if at ~= n then t = t .. "; highest with " .. istr(at) .. " GPUs" end
    return t
end

local function flush_note(c, conf)
    return "the caching allocator frees its cache and retries cudaMalloc; each flush synchronises the "
        .. "device: slower, not out of memory (flush=" .. conf.flush .. ")"
end

function M.decide(ctx, text)
    local job, conf, r = ctx.job, ctx.conf, ctx.rec
    local m, err = M.parse_record(text)
    if not m then return fail(ctx, err) end
    r.spec, r.spec_sha256, r.model = m.spec, m.sha256, m.model
    r.plugin_dp, r.plugin_request = m.dp, m.request
    if not m.cards then
        return fail(ctx, "the submit-time check failed: " .. tostring(m.error or "no prediction published"))
    end
    local req, status, why = M.eval_request(job)
    if not req and status == "none" then
        return fail(ctx, "the job asks for no GPU (no --gres=gpu, --gpus, --gpus-per-node or --gpus-per-task), so there is nothing to check the spec against")
    elseif not req then
        return fail(ctx, "cannot tell how many GPUs the job gets: " .. why)
    end
    local tres = req.kind == "node" and job.tres_per_node or req.kind == "job" and job.tres_per_job or job.tres_per_task
    r.requested_tres, r.request, r.nodes = tres, M.request_code(req), req.nodes_min
    local gtype = req.type or conf.default_gpu
    local mem = conf.gpus[gtype]
    r.gpu, r.gpus = gtype, req.gpus
    if not mem then return fail(ctx, "GPU type '" .. gtype .. "' (the job's request) is not in the site's GPU table (add gpu." .. gtype .. "=SIZE to mmguard.conf)") end
    local usable = M.usable_bytes(mem, conf)
    local c, at = judged_card(m, req, gtype, usable)
    if not c then return fail(ctx, at) end
    r.gpu_mem, r.usable, r.peak = mem, usable, model_peak(m, at)
    r.verdict, r.retries, r.card_peak, r.verdict_dp = c.kind, c.retries, c.peak, at
    local what = verdict_text(m, c, gtype, usable, mem, describe(req, tres), at, req.gpus)
    local host = M.host_check(job, m, req, conf)
    r.host = host.log
    if host.block then
        log_user("mmguard: job rejected: " .. host.reason .. "; to fit: " .. host.hint)
        return finish(ctx, "reject", what .. "; " .. host.reason, ctx.ERROR)
    elseif host.warn then
        log_user("mmguard: WARNING: " .. host.reason .. "; to fit: " .. host.hint)
        what = what .. "; " .. host.reason
    end
    if M.acceptable(c, conf) then
        if c.kind == "flushes" and conf.flush == "warn" then
            log_user("mmguard: WARNING: " .. what .. "; " .. flush_note(c, conf))
            return finish(ctx, "warn", what, ctx.SUCCESS)
        elseif c.kind == "flushes" then
            log_user("mmguard: " .. what .. "; " .. flush_note(c, conf))
        end
        return finish(ctx, host.warn and "warn" or "accept", what, ctx.SUCCESS)
    end
    if c.kind == "flushes" then what = what .. "; flush=reject" end
    if conf.action == "warn" then
        log_user("mmguard: WARNING: " .. what .. "; the job may run out of GPU memory")
        return finish(ctx, "warn", what, ctx.SUCCESS)
    end
    if conf.action == "reject" or req.kind == "task" then
        local hint = ""
        local g = req.kind == "node" and first_fit(m, req, req.count + 1, gtype, usable, conf.max_gpus_per_node, conf)
        if g then hint = string.format("; to fit: ask for %s GPUs per node (%s)", istr(g), gpu_text(req.type, g)) end
        -- the record's micro-batch is the plugin's answer on its own card and count
        if m.dp == req.gpus and m.gpu == gtype and m.usable == usable and m.mmb and m.mmb > 0 then
            hint = hint .. "; to fit: training.micro_batch_size=" .. istr(m.mmb)
        end
        log_user("mmguard: job rejected: " .. what .. hint)
        return finish(ctx, "reject", what, ctx.ERROR)
    end
    return M.resize(ctx, m, req, tres, what)
end

-- After a resize: the job's environment variables that carry the GPU count,
-- and the published record (its steps' MMGUARD_* describe the new request;
-- the largest micro-batch, computed for the old one, is dropped).
local function fix_environment(job, old_text, new, per_job, m)
    local env = job.environment
    if type(env) ~= "table" then return end
    local function reform(v, count, type_)
        -- "2" | "h100:2" | "gpu:2" | "gpu:h100:2" -> same shape, new count/type
        local f = split(v, ":")
        if #f == 1 then return type_ and (type_ .. ":" .. count) or tostring(count) end
        if f[1] == "gpu" then return "gpu:" .. (type_ and (type_ .. ":") or "") .. count end
        return (type_ or f[1]) .. ":" .. count
    end
    local names = per_job and { "SLURM_GPUS", "SBATCH_GPUS" }
        or { "SLURM_GPUS_PER_NODE", "SBATCH_GPUS_PER_NODE", "SBATCH_GRES" }
    local count = per_job and new.total or new.count
    for _, name in ipairs(names) do
        local v = env[name]
        if type(v) == "string" and v ~= "" and not v:find(",") then
            env[name] = reform(v, istr(count), new.typed and new.type or nil)
        end
    end
    local admission = string.format("resized %s -> %s", old_text, new.text)
    env["MMGUARD_ADMISSION"] = admission
    if type(env["SLURM_SPANK_MMGUARD"]) == "string" then
        m.dp, m.peak = new.total, model_peak(m, new.total) or new.peak
        m.alloc = m.has_model and M.alloc_for_dp(m, new.total) or nil
        m.gpu, m.gpu_mem, m.usable, m.mmb, m.admission = new.type, new.mem, new.usable, nil, admission
        m.request = new.code
        env["SLURM_SPANK_MMGUARD"] = M.format_record(m)
    end
end

-- The first choice that fits: more GPUs per node of the same type, then each
-- larger resize_types entry from the current count up.
local function resize_choice(m, req, r, conf)
    local per_node = req.kind == "job" and ceil_div(req.count, req.nodes_min) or req.count
    local g, c = first_fit(m, req, per_node + 1, r.gpu, r.usable, conf.max_gpus_per_node, conf)
    if g then
        return { type = r.gpu, typed = req.type ~= nil, count = g, peak = c.peak, card = c, usable = r.usable, mem = r.gpu_mem }
    end
    for _, t in ipairs(conf.resize_types) do
        local tm = conf.gpus[t]
        if t ~= r.gpu and tm and tm > r.gpu_mem then
            local tu = M.usable_bytes(tm, conf)
            g, c = first_fit(m, req, per_node, t, tu, conf.max_gpus_per_node, conf)
            if g then return { type = t, typed = true, count = g, peak = c.peak, card = c, usable = tu, mem = tm } end
        end
    end
end

function M.resize(ctx, m, req, tres, why)
    local job, conf, r = ctx.job, ctx.conf, ctx.rec
    local per_job, nodes = req.kind == "job", req.nodes_min
    local choice = resize_choice(m, req, r, conf)
    if not choice then
        local reason = why .. string.format("; no resize fits (up to %s GPUs/node of %s%s)", istr(conf.max_gpus_per_node),
            r.gpu, (#conf.resize_types > 0) and (" or " .. table.concat(conf.resize_types, ",")) or "")
        log_user("mmguard: job rejected: " .. reason)
        return finish(ctx, "reject", reason, ctx.ERROR)
    end
    local new_total = choice.count * nodes
    local list = M.parse_tres(tres)
    local old_per_node = per_job and ceil_div(req.count, nodes) or req.count
    for i, e in ipairs(list) do
        if e.gpu then
            list[i] = { gpu = true, prefix = e.prefix, type = choice.typed and choice.type or nil,
                        count = per_job and new_total or choice.count }
        end
    end
    local new_tres = M.format_tres(list)
    if per_job then job.tres_per_job = new_tres else job.tres_per_node = new_tres end
    -- one rank per GPU: keep task counts that matched the old GPU count in step
    if job.ntasks_per_node == old_per_node and old_per_node ~= choice.count then
        job.ntasks_per_node = choice.count
    end
    if job.num_tasks == req.gpus and req.gpus ~= new_total then job.num_tasks = new_total end
    local old_text = gpu_text(req.type, req.count)
    local new_text = gpu_text(choice.typed and choice.type or nil, per_job and new_total or choice.count)
    choice.total, choice.text = new_total, new_text
    choice.code = M.request_code({ kind = req.kind, type = choice.typed and choice.type or nil,
        count = per_job and new_total or choice.count, nodes_min = req.nodes_min, nodes_max = req.nodes_max })
    fix_environment(job, old_text, choice, per_job, m)
    local note = string.format("mmguard: resized %s -> %s, predicted %s/GPU", old_text, new_text,
        M.format_bytes(choice.peak))
    local prev = job.admin_comment
    job.admin_comment = (prev and prev ~= "") and (prev .. "; " .. note) or note
    log_user(string.format("mmguard: %s: predicted %s/GPU with %s does not fit %s usable; job resized to %s (%s/GPU of %s usable%s)",
        tostring(job.name or "job"), M.format_bytes(r.peak or r.card_peak), old_text, M.format_bytes(r.usable),
        new_text, M.format_bytes(choice.peak), M.format_bytes(choice.usable),
        choice.card.kind == "flushes" and ", with cache flushes: " .. retries_text(choice.card) or ""))
    r.new_tres, r.new_gpu, r.new_gpus = new_tres, choice.type, new_total
    r.new_peak, r.new_usable, r.new_verdict = choice.peak, choice.usable, choice.card.kind
    return finish(ctx, "resize", why .. "; " .. note, ctx.SUCCESS)
end

-- Slurm entry points ---------------------------------------------------------

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, rc = pcall(M.submit, job_desc, part_list, submit_uid)
    if ok then return rc end
    -- a bug here must not silently accept or lose jobs: apply on_error
    local msg = "internal error: " .. tostring(rc)
    M.log_error("mmguard: " .. msg)
    local conf = M.load_conf(M.conf_path())
    if conf and conf.on_error == "allow" then return slurm.SUCCESS end
    if slurm.log_user then slurm.log_user("%s", "mmguard: job rejected: " .. msg) end
    return slurm.ERROR
end

-- Modifications (scontrol update) are not re-checked: spank_job_env is not
-- part of a modify request.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

mmguard_jobsubmit = M

if slurm and slurm.log_info then
    slurm.log_info("%s", "mmguard: job_submit.lua loaded (mmguard.conf: " .. M.conf_path() .. ")")
end
