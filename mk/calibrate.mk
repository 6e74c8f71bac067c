# Calibration harness (contrib/calibrate, issue 6): CPU tests of everything except the
# CUDA run itself.  They use $(BUILD)/mmguard when it can be built (the predictor's CLI
# sources exist) and skip, with a message, the checks that need it otherwise.
# The GPU run itself: see docs/calibrate.md (calibrate-dry-run prints its plan).

# Debian's python3 has torch (python3-torch, installed for the oracle by `make check`),
# so the torch-side checks (built-in LoRA, the no-grad wrapper, parameter layouts) run
# too; only the transformers model smoke test is skipped (no Debian package).
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

check-calibrate: $(CALIB_MMGUARD_DEP)
	MMGUARD=$(abspath $(BUILD)/mmguard) $(CALIB_PY) tests/calibrate/run_tests.py

calibrate-dry-run:
	$(CALIB_PY) contrib/calibrate/calibrate.py --dry-run --out tests/gpu_data/calib.jsonl

CHECK_TARGETS += check-calibrate
