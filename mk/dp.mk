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
