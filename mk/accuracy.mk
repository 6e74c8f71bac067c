# The accuracy benchmark (tests/accuracy): the predictor against the real-library
# oracle's committed data (tests/truth/data/truth.jsonl, docs/oracle.md), by
# family and by parallel mode, then the GPU data (tests/gpu_data) and the
# published measurements (tests/published).  stdlib-only Python; no PyPI.
#
#   make accuracy          tables (ACCURACY_ARGS=--worst 20 for the worst rows)
#   make check-accuracy    gate: every group meets the goal (MAPE <= 1 %, no
#                          under-prediction > 2 %, peak phase >= 95 %) or is listed
#                          in tests/accuracy/baseline.json with its reason and may
#                          not get worse than it
#   make accuracy-baseline rewrite the baseline from today's numbers (reasons kept)

ACCURACY_PY       ?= python3
ACCURACY_DATA     ?= tests/truth/data/truth.jsonl
ACCURACY_BASELINE ?= tests/accuracy/baseline.json
ACCURACY_ARGS     ?=

.PHONY: accuracy check-accuracy accuracy-baseline

accuracy: $(BUILD)/mmguard
	$(ACCURACY_PY) tests/accuracy/accuracy.py --mmguard $(BUILD)/mmguard --data $(ACCURACY_DATA) $(ACCURACY_ARGS)
	$(call gpu_accuracy,)
	@$(MAKE) --no-print-directory published

check-accuracy: $(BUILD)/mmguard
	$(ACCURACY_PY) tests/accuracy/accuracy.py --mmguard $(BUILD)/mmguard --data $(ACCURACY_DATA) --check $(ACCURACY_BASELINE) $(ACCURACY_ARGS)
	$(call gpu_accuracy,--check-goals)

accuracy-baseline: $(BUILD)/mmguard
	$(ACCURACY_PY) tests/accuracy/accuracy.py --mmguard $(BUILD)/mmguard --data $(ACCURACY_DATA) --write-baseline $(ACCURACY_BASELINE)

CHECK_TARGETS += check-accuracy
