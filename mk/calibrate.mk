# Calibration harness (contrib/calibrate, issue 6): CPU tests of everything except the
# CUDA run itself.  They use $(BUILD)/mmguard when it can be built (the predictor's CLI
# sources exist) and skip, with a message, the checks that need it otherwise.
# The GPU run itself: see docs/calibrate.md (calibrate-dry-run prints its plan).

# CALIB_PY runs the comparisons (no torch needed); check-calibrate's tests run in the
# truth venv (below).
CALIB_PY ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
CALIB_MMGUARD_DEP := $(if $(wildcard predictor/cli/main.c),$(BUILD)/mmguard)

.PHONY: check-calibrate calibrate-dry-run

# The GPU half of `make accuracy` (the CPU oracle is the other): every measured data
# set in tests/gpu_data/ against the predictor's defaults; $(1) = --check-goals makes
# `make check-accuracy` fail when a goal (<= 3 % allocated, <= 5 % reserved, <= 5 %
# device) is missed or a row's spec does not describe the model that ran (REFUSED).
# tests/gpu_data/qwen-rerun/: the Qwen-VL configs re-measured with the input hooks
# removed between configs, by a harness that did not record it yet (--hooks-removed;
# tests/gpu_data/README.md).
GPU_DATA = $(sort $(wildcard tests/gpu_data/*.jsonl))
GPU_DATA_HOOKS_REMOVED = $(sort $(wildcard tests/gpu_data/qwen-rerun/*.jsonl))
define gpu_accuracy
	@if [ -z "$(GPU_DATA)" ]; then \
	    echo "GPU data: none in tests/gpu_data/ yet (measure it: docs/calibrate.md)"; \
	else for f in $(GPU_DATA); do \
	    echo "== GPU data $$f"; \
	    $(CALIB_PY) contrib/calibrate/compare.py --mmguard $(BUILD)/mmguard $(1) "$$f" || exit 1; \
	done; for f in $(GPU_DATA_HOOKS_REMOVED); do \
	    echo "== GPU data $$f (--hooks-removed)"; \
	    $(CALIB_PY) contrib/calibrate/compare.py --mmguard $(BUILD)/mmguard --hooks-removed $(1) "$$f" || exit 1; \
	done; fi
endef

# The tests run in the truth harness's venv (torch and transformers pinned, built by
# `make truth-venv`, which check-python and check-truth need anyway), so the model
# smoke tests and the Qwen-VL checks against a real tiny model (spec_for's parameter
# counts, the checkpointing hooks removed) run too; without it they skip, saying so.
check-calibrate: $(CALIB_MMGUARD_DEP)
	@py=$(CALIB_PY); mkdir -p $(BUILD); \
	if $(MAKE) --no-print-directory truth-venv >$(BUILD)/calibrate-venv.log 2>&1; then \
	    py=$(abspath $(TRUTH_VENV))/bin/python; \
	else echo "check-calibrate: no truth venv (see $(BUILD)/calibrate-venv.log): its torch tests skip"; fi; \
	echo "MMGUARD=$(abspath $(BUILD)/mmguard) $$py tests/calibrate/run_tests.py"; \
	MMGUARD=$(abspath $(BUILD)/mmguard) $$py tests/calibrate/run_tests.py

calibrate-dry-run:
	$(CALIB_PY) contrib/calibrate/calibrate.py --dry-run --out tests/gpu_data/calib.jsonl

CHECK_TARGETS += check-calibrate
