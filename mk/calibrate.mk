# Calibration harness (contrib/calibrate, issue 6): CPU tests of everything except the
# CUDA run itself.  They use $(BUILD)/mmguard when it can be built (the predictor's CLI
# sources exist) and skip, with a message, the checks that need it otherwise.
# The GPU run itself: see docs/calibrate.md (calibrate-dry-run prints its plan).

# Debian's python3 has torch (python3-torch, installed for the oracle by `make check`),
# so the torch-side checks (built-in LoRA, the no-grad wrapper, parameter layouts) run
# too; only the transformers model smoke test is skipped (no Debian package).
CALIB_PY ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,python3)
CALIB_MMGUARD_DEP := $(if $(wildcard predictor/main.c),$(BUILD)/mmguard)

.PHONY: check-calibrate calibrate-dry-run

check-calibrate: $(CALIB_MMGUARD_DEP)
	MMGUARD=$(abspath $(BUILD)/mmguard) $(CALIB_PY) tests/calibrate/run_tests.py

calibrate-dry-run:
	$(CALIB_PY) contrib/calibrate/calibrate.py --dry-run --out tests/gpu_data/calib.jsonl

CHECK_TARGETS += check-calibrate
