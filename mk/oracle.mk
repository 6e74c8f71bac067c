# CPU ground-truth oracle (tests/oracle) and accuracy benchmark (tests/accuracy).
# The oracle needs the Debian torch (python3-torch, plus libtorch-dev and
# pybind11-dev for its byte-counting allocator extension): run it with
# /usr/bin/python3.  The accuracy script is stdlib-only.

ORACLE_PY     ?= /usr/bin/python3
ACCURACY_PY   ?= python3
ORACLE_DATA   ?= tests/oracle/data/cpu_oracle.jsonl
ORACLE_COUNT  ?= 160
ORACLE_SEED   ?= 20251121
ACCURACY_ARGS ?=

.PHONY: oracle check-oracle accuracy check-accuracy

# Regenerate the data set (deterministic config list, fixed seed).
oracle:
	$(ORACLE_PY) tests/oracle/oracle.py generate --out $(ORACLE_DATA) --count $(ORACLE_COUNT) --seed $(ORACLE_SEED)

check-oracle:
	$(ORACLE_PY) tests/oracle/selftest.py

accuracy: $(BUILD)/mmguard
	$(ACCURACY_PY) tests/accuracy/accuracy.py --mmguard $(BUILD)/mmguard --data $(ORACLE_DATA) $(ACCURACY_ARGS)
	$(call gpu_accuracy,)
	@$(MAKE) --no-print-directory published

check-accuracy: $(BUILD)/mmguard
	$(ACCURACY_PY) tests/accuracy/accuracy.py --mmguard $(BUILD)/mmguard --data $(ORACLE_DATA) --check $(ACCURACY_ARGS)
	$(call gpu_accuracy,--check-goals)

CHECK_TARGETS += check-oracle check-accuracy
