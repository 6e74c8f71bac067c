--[[
contrib/job_submit.lua - mmguard admission check at slurmctld (JobSubmitPlugins=lua).

Why this file exists: the mmguard SPANK plugin runs inside sbatch, where the job's
--gres/--gpus request is not visible.  It publishes its prediction in the job's
SPANK environment (MMGUARD_* variables, job_desc.spank_job_env).  Here, at
slurmctld, the real GPU request is known, so this script makes the authoritative
comparison of the predicted per-GPU peak with the GPU's usable memory and then
accepts, warns, rejects or resizes the job (mmguard.conf `action=`).

Install: copy next to slurm.conf as job_submit.lua and set JobSubmitPlugins=lua.
The configuration is the same mmguard.conf the plugin reads (docs/jobsubmit.md).
Jobs without MMGUARD_* variables (no --mm-model) are never touched.

Tested with Slurm 22.05 (job_desc fields as exposed by job_submit_lua.c there)
and Lua 5.3 (64-bit integers are needed for byte counts).
--]]

-- Path of the shared configuration; the MMGUARD_CONF environment variable of
-- slurmctld overrides it.
local MMGUARD_CONF_PATH = "/etc/slurm/mmguard.conf"

local M = {}             -- internals, exported as the global `mmguard_jobsubmit` for tests
M.CONF_PATH = MMGUARD_CONF_PATH

local KiB = 1024
local MiB = KiB * 1024
local GiB = MiB * 1024
local TiB = GiB * 1024
-- Lua 5.1 (what Debian's slurm-wlm 22.05 links) has only doubles: byte counts
-- are exact integers up to 2^53 (8 PiB), which every input is checked against.
local MAXEXACT = 2 ^ 53
local NO_VAL = 4294967294   -- 0xfffffffe, Slurm's "not set" for uint32 fields
local INFINITE = 4294967295

M.BUILTIN_GPUS = {
    ["h100"]     = 81559 * MiB,
    ["h200"]     = 143771 * MiB,
    ["a100"]     = 81920 * MiB,
    ["a100-40g"] = 40960 * MiB,
    ["l40s"]     = 46068 * MiB,
}

local UNITS = {
    [""] = 1, b = 1,
    kb = 1000, mb = 1000000, gb = 1000000000, tb = 1000000000000,
    kib = KiB, mib = MiB, gib = GiB, tib = TiB,
}

local function trim(s)
    return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

local function is_int(x)
    return type(x) == "number" and x == math.floor(x) and x >= -MAXEXACT and x <= MAXEXACT
end

-- Integer as decimal text (no exponent, whatever the Lua version).
local function istr(x)
    return string.format("%.0f", x)
end
M.istr = istr

-- ceil(a / n) for integers 0 <= a <= 2^53, n >= 1, exactly.
local function ceil_div(a, n)
    local q = math.floor(a / n)
    local r = a - q * n
    while r < 0 do q = q - 1; r = r + n end
    while r >= n do q = q + 1; r = r - n end
    if r > 0 then q = q + 1 end
    return q
end
M.ceil_div = ceil_div

-- Non-negative integer from a decimal digit string, nil on overflow/garbage.
local function parse_uint(s)
    if type(s) ~= "string" or not s:match("^%d+$") or #s > 16 then return nil end
    local v = tonumber(s)
    if v == nil or v < 0 or v >= MAXEXACT then return nil end
    return v
end
M.parse_uint = parse_uint

-- "80GiB", "81559MiB", "1.5TiB", "512 MB", "123" -> bytes (integer) or nil, err.
-- Like mm_parse_size: the fraction's bytes are truncated (fraction digits
-- beyond the 6th are ignored here).
function M.parse_size(s)
    if type(s) ~= "string" then return nil, "not a string" end
    local t = trim(s)
    local num, unit = t:match("^(%d+%.?%d*)%s*(%a*)$")
    if num and num:sub(-1) == "." then num = nil end
    if not num then return nil, "invalid size '" .. s .. "'" end
    local mult = UNITS[unit:lower()]
    if not mult then return nil, "unknown unit '" .. unit .. "' in '" .. s .. "'" end
    local whole, frac = num:match("^(%d+)%.?(%d*)$")
    local w = parse_uint(whole)
    if not w then return nil, "size too large '" .. s .. "'" end
    if w > MAXEXACT / mult then return nil, "size too large '" .. s .. "'" end
    local v = w * mult
    frac = frac:sub(1, 6)
    if #frac > 0 then
        local scale = 10 ^ #frac
        local f = tonumber(frac)
        -- floor(f * mult / scale) exactly: mult = qm*scale + rm
        local qm = math.floor(mult / scale)
        local rm = mult - qm * scale
        v = v + qm * f + math.floor(rm * f / scale)
    end
    if v >= MAXEXACT then return nil, "size too large '" .. s .. "'" end
    return v, nil
end

-- "10%" -> {percent=10, bytes=0}; "4GiB" -> {percent=0, bytes=4GiB}
function M.parse_margin(s)
    local t = trim(s or "")
    local pct = t:match("^(%d+%.?%d*)%%$")
    if pct then
        local p = tonumber(pct)
        if not p or p < 0 or p >= 100 then return nil, "margin '" .. s .. "' must be a percentage in [0, 100)" end
        return { percent = p, bytes = 0 }, nil
    end
    local b, err = M.parse_size(t)
    if not b then return nil, "invalid margin '" .. tostring(s) .. "': " .. err end
    return { percent = 0, bytes = b }, nil
end

-- usable = mem - ceil(mem*percent/100) - margin bytes - reserve, clamped at 0
-- (mmg_config_usable / mm_usable_bytes).
function M.usable_bytes(mem, conf)
    local cut = math.ceil(mem * conf.margin.percent / 100)
    if cut >= mem then return 0 end
    local u = mem - cut - conf.margin.bytes - conf.reserve
    if u < 0 then u = 0 end
    return u
end

-- "71.3 GiB", "512.0 MiB", "12 B" (same as mm_format_bytes)
function M.format_bytes(b)
    if b < 1024 then return istr(b) .. " B" end
    local units = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" }
    local v, i = b / 1024, 1
    while v >= 1024 and i < #units do v = v / 1024; i = i + 1 end
    return string.format("%.1f %s", v, units[i])
end

local function split(s, sep)
    local out = {}
    for piece in (s .. sep):gmatch("(.-)" .. sep:gsub("%p", "%%%0")) do out[#out + 1] = piece end
    return out
end

-- GPU type names as Slurm GRES types use them: [A-Za-z0-9_.-], 1..31 chars.
local function valid_gpu_name(s)
    return type(s) == "string" and #s >= 1 and #s <= 31 and s:match("^[%w_%.%-]+$") ~= nil
end

local BOOL = { yes = true, ["true"] = true, ["1"] = true, on = true,
               no = false, ["false"] = false, ["0"] = false, off = false }

-- "10%+2147483648" (margin percent, then margin bytes + reserve), as the plugin writes it.
function M.margin_text(conf)
    return string.format("%g%%+%s", conf.margin.percent, istr(conf.margin.bytes + conf.reserve))
end

local function default_conf()
    local gpus = {}
    for k, v in pairs(M.BUILTIN_GPUS) do gpus[k] = v end
    return {
        action = "reject",
        margin = { percent = 0, bytes = 0 },
        reserve = 0,
        gpus = gpus,
        default_gpu = "h100",
        on_error = "reject",
        max_gpus_per_node = 8,
        resize_types = {},
        ctld_log = nil,
        log = nil,
        syslog = false,
    }
end
M.default_conf = default_conf

-- Parse mmguard.conf text.  Returns conf, errors (list of "conf:LINE: msg").
-- Errors never abort: the bad line is skipped and the caller applies on_error.
function M.parse_conf(text, name)
    local conf, errs = default_conf(), {}
    name = name or "mmguard.conf"
    local lineno = 0
    local function bad(msg) errs[#errs + 1] = string.format("%s:%d: %s", name, lineno, msg) end
    for raw in (text .. "\n"):gmatch("([^\n]*)\n") do
        lineno = lineno + 1
        local line = trim(raw:gsub("\r$", ""))
        if line ~= "" and line:sub(1, 1) ~= "#" then
            local key, val = line:match("^([^=]-)%s*=%s*(.*)$")
            if not key or key == "" then
                bad("expected key=value, got '" .. line .. "'")
            else
                key = trim(key)
                if key == "action" then
                    if val == "reject" or val == "warn" or val == "resize" then conf.action = val
                    else bad("action must be reject|warn|resize, got '" .. val .. "'") end
                elseif key == "margin" then
                    local m, err = M.parse_margin(val)
                    if m then conf.margin = m else bad(err) end
                elseif key == "reserve" then
                    local b, err = M.parse_size(val)
                    if b then conf.reserve = b else bad("reserve: " .. err) end
                elseif key:match("^gpu%.") then
                    local t = key:sub(5):lower()
                    local b, err = M.parse_size(val)
                    if not valid_gpu_name(t) then bad("invalid GPU type name in '" .. key .. "'")
                    elseif not b or b == 0 then bad(key .. ": " .. (err or "size must be > 0"))
                    else conf.gpus[t] = b end
                elseif key == "default_gpu" then
                    if valid_gpu_name(val) then conf.default_gpu = val:lower()
                    else bad("default_gpu: invalid GPU type '" .. val .. "'") end
                elseif key == "log" or key == "ctld_log" then
                    if val == "" or val == "none" then conf[key] = nil
                    elseif val:sub(1, 1) ~= "/" then bad(key .. ": '" .. val .. "' is not an absolute path")
                    elseif val:find("%c") then bad(key .. ": control character in path")
                    else conf[key] = val end
                elseif key == "syslog" then
                    if BOOL[val] ~= nil then conf.syslog = BOOL[val]
                    else bad("syslog: invalid value '" .. val .. "' (yes|no)") end
                elseif key == "on_error" then
                    if val == "reject" or val == "allow" then conf.on_error = val
                    else bad("on_error must be reject|allow, got '" .. val .. "'") end
                elseif key == "max_gpus_per_node" then
                    local n = parse_uint(val)
                    if n and n >= 1 and n <= 1024 then conf.max_gpus_per_node = n
                    else bad("max_gpus_per_node must be an integer 1..1024, got '" .. val .. "'") end
                elseif key == "resize_types" then
                    local list, okl = {}, true
                    if val ~= "" then
                        for _, t in ipairs(split(val, ",")) do
                            if not valid_gpu_name(t) then
                                bad("resize_types: invalid GPU type '" .. t .. "' in '" .. val .. "'")
                                okl = false
                                break
                            end
                            list[#list + 1] = t:lower()
                        end
                    end
                    if okl then conf.resize_types = list end
                else
                    bad("unknown key '" .. key .. "'")
                end
            end
        end
    end
    if not conf.gpus[conf.default_gpu] then
        errs[#errs + 1] = name .. ": default_gpu '" .. conf.default_gpu .. "' has no size (add gpu." .. conf.default_gpu .. "=SIZE)"
    end
    for _, t in ipairs(conf.resize_types) do
        if not conf.gpus[t] then
            errs[#errs + 1] = name .. ": resize_types: unknown GPU type '" .. t .. "'"
        end
    end
    if conf.gpus[conf.default_gpu] and M.usable_bytes(conf.gpus[conf.default_gpu], conf) == 0 then
        errs[#errs + 1] = name .. ": margin/reserve leave no usable memory on " .. conf.default_gpu
    end
    return conf, errs
end

function M.conf_path()
    local p = os.getenv("MMGUARD_CONF")
    if p and p ~= "" then return p end
    return M.CONF_PATH
end

function M.load_conf(path)
    local f, err = io.open(path, "r")
    if not f then
        return default_conf(), { "cannot read " .. path .. ": " .. tostring(err) }
    end
    local text = f:read("*a") or ""
    f:close()
    return M.parse_conf(text, path)
end

------------------------------------------------------------------------------
-- The published prediction.
------------------------------------------------------------------------------

-- "v1 ctx=<B> nccl=<B> afix=<B> afrac=<float> [dp1=<B>] terms=F:S,F:S,..." -> model or nil, err
-- dp1 (optional) is the allocated peak at N = 1 (mm_prediction.allocated_dp1);
-- without it the terms are evaluated at N = 1 too.
function M.parse_peak_model(s)
    if type(s) ~= "string" then return nil, "MMGUARD_PEAK_MODEL missing" end
    local words = {}
    for w in s:gmatch("%S+") do words[#words + 1] = w end
    if words[1] ~= "v1" then return nil, "MMGUARD_PEAK_MODEL: unsupported version (want v1)" end
    local m, seen = { terms = {} }, {}
    for i = 2, #words do
        local k, v = words[i]:match("^([%w_]+)=(.*)$")
        if not k then return nil, "MMGUARD_PEAK_MODEL: bad field '" .. words[i] .. "'" end
        if seen[k] then return nil, "MMGUARD_PEAK_MODEL: duplicate field '" .. k .. "'" end
        seen[k] = true
        if k == "ctx" or k == "nccl" or k == "afix" or k == "dp1" then
            m[k] = parse_uint(v)
            if not m[k] then return nil, "MMGUARD_PEAK_MODEL: bad " .. k .. " '" .. v .. "'" end
        elseif k == "afrac" then
            local f = v:match("^%d+%.?%d*[eE]?[-+]?%d*$") and tonumber(v)
            if not f or f ~= f or f < 0 or f > 10 then
                return nil, "MMGUARD_PEAK_MODEL: bad afrac '" .. v .. "'"
            end
            m.afrac = f + 0.0
        elseif k == "terms" then
            for _, pair in ipairs(split(v, ",")) do
                local fs, ss = pair:match("^(%d+):(%d+)$")
                local F, S = parse_uint(fs), parse_uint(ss)
                if not F or not S then return nil, "MMGUARD_PEAK_MODEL: bad term '" .. pair .. "'" end
                m.terms[#m.terms + 1] = { F, S }
            end
            if #m.terms == 0 or #m.terms > 64 then return nil, "MMGUARD_PEAK_MODEL: bad term count" end
        else
            return nil, "MMGUARD_PEAK_MODEL: unknown field '" .. k .. "'"
        end
    end
    for _, k in ipairs({ "ctx", "nccl", "afix", "afrac", "terms" }) do
        if not seen[k] then return nil, "MMGUARD_PEAK_MODEL: missing " .. k end
    end
    return m, nil
end

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

-- allocated(1) = dp1 (when published), allocated(N) = max_k (F_k + ceil(S_k / N))
-- peak(N) = ceil(allocated(N) * (1 + afrac)) + afix + ctx + (N > 1 and nccl or 0)
-- Mirrors mm_peak_for_dp() in predictor/predict.c (which rounds the allocator
-- slack up in long double; here the product is exact).
function M.alloc_for_dp(m, n)
    if n == 1 and m.dp1 then return m.dp1 end
    local best = 0
    for _, t in ipairs(m.terms) do
        local a = add(t[1], ceil_div(t[2], n))
        if a > best then best = a end
    end
    return best
end

function M.peak_for_dp(m, n)
    assert(is_int(n) and n >= 1, "N must be an integer >= 1")
    local alloc = M.alloc_for_dp(m, n)
    local peak = add(alloc, ceil_mul(alloc, m.afrac))
    peak = add(peak, m.afix)
    peak = add(peak, m.ctx)
    if n > 1 then peak = add(peak, m.nccl) end
    return peak
end

------------------------------------------------------------------------------
-- The job's GPU request.
------------------------------------------------------------------------------

-- One comma-separated tres string -> list of entries.  A GPU entry is
-- {gpu=true, prefix="gres:", type=nil|"h100", count=N, typed=bool}; others are
-- kept verbatim.  Returns nil, err on a GPU entry we cannot read.
function M.parse_tres(s)
    local out = {}
    if s == nil or s == "" then return out end
    for _, item in ipairs(split(s, ",")) do
        local prefix, rest = item:match("^(gres[:/])(.*)$")
        if not prefix then prefix, rest = "", item end
        local fields = split(rest, ":")
        if fields[1] == "gpu" then
            local e = { gpu = true, prefix = prefix }
            if #fields == 1 then
                e.count = 1
            elseif #fields == 2 then
                local n = parse_uint(fields[2])
                if n then e.count = n else e.type = fields[2]; e.count = 1 end
            elseif #fields == 3 then
                e.type = fields[2]
                e.count = parse_uint(fields[3])
            end
            if not e.count or (e.type and not e.type:match("^[%w_%-%.]+$")) then
                return nil, "cannot read GPU request '" .. item .. "'"
            end
            if e.type then e.type = e.type:lower() end
            out[#out + 1] = e
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

local function gpu_entry(list)
    local found, n = nil, 0
    for _, e in ipairs(list) do
        if e.gpu then found = found or e; n = n + 1 end
    end
    return found, n
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
-- Decision.
------------------------------------------------------------------------------

local function spank_env(job_desc)
    local env = job_desc.spank_job_env
    local vars, any = {}, false
    if type(env) ~= "table" then return vars, false end
    for _, kv in pairs(env) do
        if type(kv) == "string" then
            local k, v = kv:match("^([^=]+)=(.*)$")
            if k and k:sub(1, 8) == "MMGUARD_" then vars[k] = v; any = true end
        end
    end
    return vars, any
end
M.spank_env = spank_env

-- Time limit in minutes: the job's, else the partition's default/max; nil if unknown.
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

local function write_log(conf, rec)
    if not conf.ctld_log then return end
    local f, err = io.open(conf.ctld_log, "a")
    if not f then
        M.log_error("mmguard: cannot open ctld_log " .. conf.ctld_log .. ": " .. tostring(err))
        return
    end
    f:write(M.json_object(rec), "\n")
    f:close()
end

function M.log_error(msg)
    if slurm and slurm.log_error then slurm.log_error("%s", msg) end
end
function M.log_info(msg)
    if slurm and slurm.log_info then slurm.log_info("%s", msg) end
end
local function log_user(msg)
    if slurm and slurm.log_user then slurm.log_user("%s", msg) end
end

-- Update the job's environment variables that carry the GPU count, if set.
local function fix_environment(job_desc, old, new, per_job)
    local env = job_desc.environment
    if env == nil then return end
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
            env[name] = reform(v, count, new.typed and new.type or nil)
        end
    end
    env["MMGUARD_ADMISSION"] = string.format("resized %s -> %s", old, new.text)
end

-- Core of the script: returns rc (slurm.SUCCESS/ERROR).
function M.submit(job_desc, part_list, submit_uid)
    local SUCCESS = (slurm and slurm.SUCCESS) or 0
    local ERROR = (slurm and slurm.ERROR) or -1

    local vars, any = spank_env(job_desc)
    if not any then return SUCCESS end

    local conf, conf_errs = M.load_conf(M.conf_path())
    local nodes = job_desc.min_nodes
    if not nodes or nodes == NO_VAL or nodes == INFINITE or nodes < 1 then nodes = 1 end
    if not is_int(nodes) then nodes = 1 end

    local rec = {
        time = os.date("!%Y-%m-%dT%H:%M:%SZ"),
        user = job_desc.user_name,
        uid = job_desc.user_id,
        job_name = job_desc.name,
        spec = vars.MMGUARD_SPEC,
        spec_sha256 = vars.MMGUARD_SPEC_SHA256,
        model = vars.MMGUARD_MODEL,
        source = "slurmctld",
        margin = { raw = M.json_object({ { "percent", { raw = M.json_double(conf.margin.percent) } },
            { "bytes", conf.margin.bytes }, { "reserve_bytes", conf.reserve },
            { "text", M.margin_text(conf) } }) },
        action = conf.action,
        requested_tres = nil,
        nodes = nodes,
        time_limit_minutes = time_limit_minutes(job_desc, part_list),
    }
    local function finish(decision, reason, rc)
        rec.decision, rec.reason = decision, reason
        write_log(conf, {
            { "time", rec.time }, { "source", rec.source }, { "decision", rec.decision },
            { "reason", rec.reason }, { "action", rec.action }, { "user", rec.user }, { "uid", rec.uid },
            { "job_name", rec.job_name }, { "spec", rec.spec }, { "spec_sha256", rec.spec_sha256 },
            { "model", rec.model }, { "gpu", rec.gpu }, { "gpu_mem_bytes", rec.gpu_mem },
            { "gpus", rec.gpus }, { "nodes", rec.nodes }, { "data_parallel", rec.gpus },
            { "peak_bytes", rec.peak }, { "usable_bytes", rec.usable }, { "margin", rec.margin },
            { "time_limit_minutes", rec.time_limit_minutes },
            { "requested_tres", rec.requested_tres }, { "new_tres", rec.new_tres },
            { "new_gpu", rec.new_gpu }, { "new_gpus", rec.new_gpus },
            { "new_peak_bytes", rec.new_peak }, { "new_usable_bytes", rec.new_usable },
        })
        M.log_info(string.format("mmguard: job %s uid %s: %s: %s",
            tostring(rec.job_name), tostring(rec.uid), decision, reason))
        return rc
    end
    local function fail(reason)
        M.log_error("mmguard: " .. reason)
        if conf.on_error == "allow" then
            return finish("error", reason .. " (on_error=allow: job accepted)", SUCCESS)
        end
        log_user("mmguard: job rejected: " .. reason ..
            " (on_error=reject; contact your administrator or resubmit without --mm-model)")
        return finish("error", reason .. " (on_error=reject)", ERROR)
    end

    if #conf_errs > 0 then return fail("configuration: " .. table.concat(conf_errs, "; ")) end

    local ok, rc = pcall(M.decide, job_desc, vars, conf, nodes, rec, finish, fail, SUCCESS, ERROR)
    if ok then return rc end
    return fail("internal error: " .. tostring(rc))
end

-- The comparison and the action; errors raised here are turned into on_error.
function M.decide(job_desc, vars, conf, nodes, rec, finish, fail, SUCCESS, ERROR)

    if vars.MMGUARD_DECISION == "error" and not vars.MMGUARD_PEAK_MODEL then
        return fail("the submit-time check failed: " .. tostring(vars.MMGUARD_ERROR or "no prediction published"))
    end
    local model, merr = M.parse_peak_model(vars.MMGUARD_PEAK_MODEL)
    if not model then return fail(merr) end
    -- allocated peak at N = 1, published beside the model (docs/plugin.md)
    if vars.MMGUARD_ALLOC_DP1_BYTES ~= nil and not model.dp1 then
        model.dp1 = parse_uint(vars.MMGUARD_ALLOC_DP1_BYTES)
        if not model.dp1 then
            return fail("MMGUARD_ALLOC_DP1_BYTES: bad value '" .. vars.MMGUARD_ALLOC_DP1_BYTES .. "'")
        end
    end

    -- the real GPU request
    local tpn_s, tpj_s = job_desc.tres_per_node, job_desc.tres_per_job
    local tpn, e1 = M.parse_tres(tpn_s)
    if not tpn then return fail(e1) end
    local tpj, e2 = M.parse_tres(tpj_s)
    if not tpj then return fail(e2) end
    local g_node, n_node = gpu_entry(tpn)
    local g_job, n_job = gpu_entry(tpj)
    if n_node > 1 or n_job > 1 then return fail("more than one GPU entry in the request") end
    for _, f in ipairs({ "tres_per_task", "tres_per_socket" }) do
        local v = job_desc[f]
        if v and v:find("gpu") then
            return fail("GPU request per " .. f:sub(10) .. " (" .. v .. ") is not supported by mmguard")
        end
    end
    local per_job = false
    local entry, per_node_count, total
    if g_node then
        entry, per_node_count = g_node, g_node.count
        total = per_node_count * nodes
        rec.requested_tres = tpn_s
    elseif g_job then
        per_job, entry = true, g_job
        total = g_job.count
        per_node_count = ceil_div(total, nodes)
        rec.requested_tres = tpj_s
    else
        -- Nothing to compare at slurmctld: the job will get no GPU.  Accept it
        -- unchanged (resizing a CPU job into a GPU job is not ours to decide).
        local reason = "the job has --mm-model but requests no GPU (--gres=gpu:N or --gpus); not checked at admission"
        log_user("mmguard: WARNING: " .. reason)
        return finish("warn", reason, SUCCESS)
    end
    if total < 1 then return fail("the job requests 0 GPUs") end

    local gtype = entry.type or conf.default_gpu
    local mem = conf.gpus[gtype]
    rec.gpu, rec.gpus = gtype, total
    if not mem then return fail("unknown GPU type '" .. gtype .. "' (add gpu." .. gtype .. "=SIZE to mmguard.conf)") end
    local usable = M.usable_bytes(mem, conf)
    local ok, peak = pcall(M.peak_for_dp, model, total)
    if not ok then return fail("MMGUARD_PEAK_MODEL: " .. tostring(peak)) end
    rec.gpu_mem, rec.usable, rec.peak = mem, usable, peak

    local req_text = short_gpu(entry.type, per_job and total or per_node_count)
    if peak <= usable then
        return finish("accept", string.format("predicted %s/GPU fits %s usable on %s (N=%s)",
            M.format_bytes(peak), M.format_bytes(usable), gtype, istr(total)), SUCCESS)
    end

    local why = string.format("predicted peak %s/GPU at %s-way data parallel exceeds %s usable on %s (%s, margin %g%%%s, reserve %s)",
        M.format_bytes(peak), istr(total), M.format_bytes(usable), gtype, M.format_bytes(mem),
        conf.margin.percent, conf.margin.bytes > 0 and (" + " .. M.format_bytes(conf.margin.bytes)) or "",
        M.format_bytes(conf.reserve))

    if conf.action == "warn" then
        log_user("mmguard: WARNING: " .. why .. "; the job may run out of GPU memory")
        return finish("warn", why, SUCCESS)
    end

    if conf.action == "reject" then
        local hint = ""
        if vars.MMGUARD_MAX_MICRO_BATCH and vars.MMGUARD_MAX_MICRO_BATCH ~= "" and vars.MMGUARD_MAX_MICRO_BATCH ~= "0" then
            hint = "; largest micro-batch that fits: " .. vars.MMGUARD_MAX_MICRO_BATCH
        end
        log_user("mmguard: job rejected: " .. why .. hint)
        return finish("reject", why, ERROR)
    end

    -- action=resize: same type with more GPUs per node first, then larger GPU types.
    local choice
    for g = per_node_count + 1, conf.max_gpus_per_node do
        local p = M.peak_for_dp(model, g * nodes)
        if p <= usable then choice = { type = gtype, typed = entry.type ~= nil, count = g, peak = p, usable = usable, mem = mem }; break end
    end
    if not choice then
        for _, t in ipairs(conf.resize_types) do
            local tm = conf.gpus[t]
            if t ~= gtype and tm and tm > mem then
                local tu = M.usable_bytes(tm, conf)
                for g = per_node_count, conf.max_gpus_per_node do
                    local p = M.peak_for_dp(model, g * nodes)
                    if p <= tu then choice = { type = t, typed = true, count = g, peak = p, usable = tu, mem = tm }; break end
                end
            end
            if choice then break end
        end
    end
    if not choice then
        local reason = why .. string.format("; no resize fits (up to %s GPUs/node of %s%s)", istr(conf.max_gpus_per_node),
            gtype, (#conf.resize_types > 0) and (" or " .. table.concat(conf.resize_types, ",")) or "")
        log_user("mmguard: job rejected: " .. reason)
        return finish("reject", reason, ERROR)
    end

    -- apply
    local new_total = choice.count * nodes
    local new_entry = { gpu = true, prefix = entry.prefix, type = choice.typed and choice.type or nil,
        count = per_job and new_total or choice.count }
    for i, e in ipairs(per_job and tpj or tpn) do
        if e.gpu then (per_job and tpj or tpn)[i] = new_entry end
    end
    local new_tres = M.format_tres(per_job and tpj or tpn)
    if per_job then job_desc.tres_per_job = new_tres else job_desc.tres_per_node = new_tres end
    -- one rank per GPU: keep task counts that matched the old GPU count in step
    local old_total = total
    if job_desc.ntasks_per_node == per_node_count and per_node_count ~= choice.count then
        job_desc.ntasks_per_node = choice.count
    end
    if job_desc.num_tasks == old_total and old_total ~= new_total then
        job_desc.num_tasks = new_total
    end
    local new_text = short_gpu(new_entry.type, new_entry.count)
    fix_environment(job_desc, req_text, { text = new_text, count = choice.count, total = new_total,
        type = choice.type, typed = choice.typed }, per_job)
    local note = string.format("mmguard: resized %s -> %s, predicted %s/GPU", req_text, new_text,
        M.format_bytes(choice.peak))
    local prev = job_desc.admin_comment
    if prev and prev ~= "" then job_desc.admin_comment = prev .. "; " .. note
    else job_desc.admin_comment = note end
    log_user(string.format("mmguard: %s: predicted %s/GPU with %s does not fit %s usable; job resized to %s (%s/GPU of %s usable)",
        tostring(job_desc.name or "job"), M.format_bytes(peak), req_text, M.format_bytes(usable),
        new_text, M.format_bytes(choice.peak), M.format_bytes(choice.usable)))
    rec.new_tres, rec.new_gpu, rec.new_gpus = new_tres, choice.type, new_total
    rec.new_peak, rec.new_usable = choice.peak, choice.usable
    return finish("resize", why .. "; " .. note, SUCCESS)
end

-- Slurm entry points ---------------------------------------------------------

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ok, rc = pcall(M.submit, job_desc, part_list, submit_uid)
    if ok then return rc end
    -- a bug here must not silently accept or lose jobs: apply on_error
    local msg = "internal error: " .. tostring(rc)
    M.log_error("mmguard: " .. msg)
    local conf = M.load_conf(M.conf_path())
    if conf.on_error == "allow" then return slurm.SUCCESS end
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
    slurm.log_info("%s", "mmguard: job_submit.lua loaded")
end
