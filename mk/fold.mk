# mk/fold.mk - the allocator replay's fold is exact (issue 24; what it folds:
# predictor/engine/alloc_fold.h): every shipped preset (predict, fit, check at
# its own boundaries), every truth row and every GPU row predicted with and
# without MMGUARD_REPLAY_FOLD, byte-identical, and the fold must have fired
# (tests/fold/fold.py); and every one of those results is the one tests/fold/golden.txt
# holds (a digest each: a change that moves a prediction rewrites it with
# `fold.py --write-golden tests/fold/golden.txt`, and its diff names what moved).
# The same on the presets and the Qwen/LLaVA rows under ASan+UBSan.
#
#   make check-fold

.PHONY: check-fold
check-fold: $(BUILD)/mmguard $(BUILD)/mmguard-asan
	MMGUARD=$(BUILD)/mmguard python3 tests/fold/fold.py --golden tests/fold/golden.txt
	@echo "-- the same under ASan+UBSan (presets, Qwen and LLaVA rows)"
	@MMGUARD=$(BUILD)/mmguard-asan ASAN_OPTIONS=detect_leaks=1 \
	    python3 tests/fold/fold.py --only 'qwen|llava' >$(BUILD)/fold-asan.log 2>&1 \
	    || { cat $(BUILD)/fold-asan.log; exit 1; }
	@tail -1 $(BUILD)/fold-asan.log

CHECK_TARGETS += check-fold
