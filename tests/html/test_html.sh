#!/bin/sh
# test_html.sh - the pictures (issue 25) rendered in a real browser: Debian's
# headless Chromium loads `mmguard predict --html` and `mmguard report --html`
# pages from disk (no network: --no-proxy-server, and the pages must not name
# any URL), takes a screenshot of each (a PNG of the window's size, not
# blank) and dumps the DOM after layout: the elements each chart must have
# are counted there.  MMGUARD=build/mmguard CHROMIUM=chromium.
# Prints "N passed, N failed" last.
set -u
M=${MMGUARD:-build/mmguard}
C=${CHROMIUM:-chromium}
T=$(mktemp -d /tmp/mmguard-html.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }
check() { _n=$1; shift; if "$@"; then ok "$_n"; else bad "$_n"; fi; }
command -v "$C" >/dev/null || { echo "Bail out! $C not installed (sh scripts/install-deps.sh browser)"; exit 1; }

render() { # render PAGE WIDTH HEIGHT: $T/PAGE.png and $T/PAGE.dom
    timeout 60 "$C" --headless=new --no-sandbox --disable-gpu --no-proxy-server --hide-scrollbars \
        --user-data-dir="$T/profile" --window-size="$2,$3" --screenshot="$T/$1.png" \
        "file://$T/$1.html" >"$T/$1.log" 2>&1
    timeout 60 "$C" --headless=new --no-sandbox --disable-gpu --no-proxy-server \
        --user-data-dir="$T/profile" --dump-dom "file://$T/$1.html" >"$T/$1.dom" 2>>"$T/$1.log"
}
# png_ok FILE W H: a PNG of W x H pixels, larger than a blank page compresses to
png_ok() {
    python3 - "$1" "$2" "$3" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert (w, h) == (int(sys.argv[2]), int(sys.argv[3])), (w, h)
assert len(data) > 20000, "%d bytes: a blank page?" % len(data)
PY
}
# count DOM PATTERN: occurrences of an element pattern in the DOM dump
count() { grep -o -- "$2" "$T/$1.dom" | wc -l | tr -d ' '; }
no_net() { ! grep -Eqi '<script|https?://[a-z]|<link |src="' "$T/$1.html"; }

"$M" predict contrib/models/llava-1.5-7b-finetune.yaml --gpu-mem 80GiB --html "$T/predict.html" >/dev/null
check "predict --html writes a page" [ -s "$T/predict.html" ]
check "predict page: no script, no URL, no external file" no_net predict
render predict 1000 900
check "predict page: screenshot 1000x900, not blank" png_ok "$T/predict.png" 1000 900
check "predict page: two stacked charts" [ "$(count predict '<svg id="live-by')" = 2 ]
# in_svg PAGE ID PATTERN: occurrences of PATTERN inside <svg id="ID">
in_svg() {
    python3 - "$T/$1.dom" "$2" "$3" <<'PY'
import re, sys
dom = open(sys.argv[1]).read()
m = re.search(r'<svg id="%s".*?</svg>' % re.escape(sys.argv[2]), dom, re.S)
print(len(re.findall(re.escape(sys.argv[3]), m.group(0))) if m else -1)
PY
}
check "predict page: 4 factor layers (parameters, gradients, optimizer, activations)" [ "$(in_svg predict live-by-factor 'class="layer"')" = 4 ]
check "predict page: 3 module layers" [ "$(in_svg predict live-by-module 'class="layer"')" = 3 ]
check "predict page: a legend entry per layer and line" [ "$(in_svg predict live-by-factor 'class="legend"')" = 8 ]
check "predict page: the predicted device peak line" [ "$(count predict 'id="device-peak"')" = 2 ]
# the timeline's allocated peak is the prediction's, for specs of every parallel kind
for s in llava-1.5-7b-finetune qwen2.5-vl-7b-lora llama-3.1-8b-full smolvlm-qlora; do
    "$M" predict contrib/models/$s.yaml --html "$T/$s.html" --json >"$T/$s.json"
    live=$(sed -n 's/.*data-peak-live="\([0-9]*\)".*/\1/p' "$T/$s.html")
    want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["allocated_peak_bytes"])' "$T/$s.json")
    check "timeline's allocated peak = predicted allocated peak ($s: $want)" [ "$live" = "$want" ]
done
check "predict page: the reserved line" [ "$(count predict 'id="reserved"')" = 2 ]
check "predict page: the peak event" [ "$(count predict 'id="peak"')" = 2 ]
check "predict page: the card's capacity" [ "$(count predict 'id="capacity"')" = 2 ]
# the device peak the page names is the prediction's peak_bytes (GiB, 2 decimals)
peak=$("$M" predict contrib/models/llava-1.5-7b-finetune.yaml --json |
       python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["peak_bytes"] / 2**30))')
check "predict page: the peak named ($peak GiB)" grep -q "predicted device peak <b>$peak GiB</b>" "$T/predict.dom"
"$M" predict contrib/models/llava-1.5-7b-finetune.yaml --html "$T/nocard.html" >/dev/null
check "predict page without --gpu-mem: no capacity line" sh -c "! grep -q 'id=\"capacity\"' '$T/nocard.html'"

LOG=tests/fixtures/outcome/synthetic-loop.jsonl
"$M" report "$LOG" --html "$T/report.html" >/dev/null
check "report --html writes a page" [ -s "$T/report.html" ]
check "report page: no script, no URL, no external file" no_net report
render report 1000 1800
check "report page: screenshot 1000x1800, not blank" png_ok "$T/report.png" 1000 1800
for id in decisions scatter histogram advice; do
    check "report page: chart $id" [ "$(count report "<svg id=\"$id\"")" = 1 ]
done
jobs=$("$M" report --json "$LOG" | python3 -c 'import json,sys; print(json.load(sys.stdin)["outcomes"]["error"]["jobs"])')
check "report page: one dot per measured job ($jobs)" [ "$(count report 'class="job"')" = "$jobs" ]
check "report page: 20 histogram bins" [ "$(count report 'class="bin"')" = 20 ]
check "report page: two advice curves" [ "$(count report 'class="curve"')" = 2 ]
check "report page: decision bars" [ "$(count report 'class="bar"')" -ge 3 ]
printf '{"decision":"accept","user":"<script>alert(1)</script>","time":"2026-11-01T00:00:00Z"}\n' >"$T/evil.jsonl"
"$M" report "$T/evil.jsonl" --html "$T/evil.html" >/dev/null
check "report page: log text cannot inject markup" sh -c "! grep -q '<script' '$T/evil.html'"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
