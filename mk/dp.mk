# mk/dp.mk - the data-parallel peak model against direct predictions at every
# N = 1..4096 (tests/dp/dp_exact.c): ZeRO 0-3, FSDP, LoRA, offload, paged
# optimizer states, accumulation.  The unit suite "fit" checks 27 degrees of
# small specs; this checks all 4096 of full-size ones (a few minutes).
#
#   make check-dp

DP_EXACT := $(BUILD)/dp_exact
$(DP_EXACT): tests/dp/dp_exact.c $(BUILD)/libmmguard.a $(HDRS)
	$(CC) $(CFLAGS_ALL) tests/dp/dp_exact.c $(BUILD)/libmmguard.a $(PKG_LIBS) -lm -o $@

M7  := contrib/models/llava-1.5-7b-finetune.yaml
DP_CASES := \
  "$(M7) training.zero_stage=0" \
  "$(M7) training.zero_stage=1" \
  "$(M7) training.zero_stage=2" \
  "$(M7)" \
  "$(M7) training.zero_stage=0 fsdp.version=2" \
  "$(M7) training.zero_stage=0 fsdp.version=1 training.gradient_accumulation_steps=2" \
  "contrib/models/llava-1.5-7b-lora.yaml" \
  "contrib/models/llava-1.5-13b-lora.yaml training.zero_stage=2" \
  "tests/import/specs/llava-1.5-7b-zero3-offload.yaml" \
  "$(M7) training.zero_stage=2 training.optimizer=paged_adamw_8bit"

.PHONY: check-dp
check-dp: $(DP_EXACT)
	@fail=0; for c in $(DP_CASES); do $(DP_EXACT) $$c || fail=1; done; \
	  [ $$fail = 0 ] && echo "dp model: every N (1..4096; ZeRO/FSDP 1..512) equals a direct prediction" || exit 1

CHECK_TARGETS += check-dp

# The published verdicts (record.h cards=) as job_submit.lua decides them,
# against `mmguard check --json` at every (GPU type, count) the record covers:
# fits, fits with cache flushes and out of memory, under each flush= policy
# (tests/jobsubmit/verdict_check.py).  Also in `make check-jobsubmit`.
VERDICT_TOOL := $(BUILD)/verdict_tool
$(VERDICT_TOOL): tests/jobsubmit/verdict_tool.c spank_plugin/record.c spank_plugin/record.h $(BUILD)/libmmguard.a $(HDRS)
	$(CC) $(CFLAGS_ALL) -Ispank_plugin tests/jobsubmit/verdict_tool.c spank_plugin/record.c $(BUILD)/libmmguard.a $(PKG_LIBS) -lm -o $@

.PHONY: check-dp-verdict
check-dp-verdict: $(VERDICT_TOOL) $(BUILD)/mmguard contrib/job_submit.lua
	@lua=$$(for l in lua5.1 lua5.3 lua5.4; do command -v $$l && break; done); \
	  [ -n "$$lua" ] || { echo "no Lua interpreter"; exit 1; }; \
	  python3 tests/jobsubmit/verdict_check.py $(BUILD)/mmguard $(VERDICT_TOOL) $$lua contrib/job_submit.lua

check-dp: check-dp-verdict
