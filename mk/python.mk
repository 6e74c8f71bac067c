# mk/python.mk - the job-side recorder (python/, issue 25): `pip install ./python`.
#
#   make check-python   install ./python (pinned flit_core, no dependencies) into
#                       $(BUILD)/python and run tests/python/ with the project's CPU
#                       venv (make truth-venv: torch + transformers), real steps;
#                       mmguard.predict through $(BUILD)/libmmguard.so (ctypes)
#
# PYREC_PY may name another interpreter with torch and transformers.

PYREC_PY  ?= $(TRUTH_PY)
PYREC_DIR := $(BUILD)/python

.PHONY: check-python python-install

$(PYREC_DIR)/.stamp: python/pyproject.toml $(wildcard python/mmguard/*.py)
	rm -rf $(PYREC_DIR)
	$(PYREC_PY) -m pip install --quiet --no-deps --target $(PYREC_DIR) ./python
	touch $@

python-install: $(PYREC_DIR)/.stamp

check-python: $(BUILD)/mmguard $(BUILD)/libmmguard.so
	@if [ "$(PYREC_PY)" = "$(TRUTH_PY)" ]; then $(MAKE) --no-print-directory truth-venv; fi
	$(MAKE) --no-print-directory python-install
	PYTHONPATH=$(abspath $(PYREC_DIR)) $(PYREC_PY) tests/python/test_recorder.py
	MMGUARD_LIB=$(abspath $(BUILD)/libmmguard.so) MMGUARD=$(abspath $(BUILD)/mmguard) \
	  PYTHONPATH=$(abspath $(PYREC_DIR)) $(PYREC_PY) tests/python/test_predict.py

CHECK_TARGETS += check-python

# `mmguard report` on a recorded (synthetic) log of many jobs: the outcome
# section recomputed independently (tests/loop/test_report_loop.py)
.PHONY: check-loop
check-loop: $(BUILD)/mmguard
	python3 tests/loop/test_report_loop.py $(BUILD)/mmguard

CHECK_TARGETS += check-loop

# The shared library Python's ctypes loads (mmguard.predict, python/mmguard/predict.py):
# the same objects as libmmguard.a (built -fPIC), every symbol of the public API.
LIBMMGUARD_SO := $(BUILD)/libmmguard.so
$(LIBMMGUARD_SO): $(LIB_OBJS)
	$(CC) -shared $(LDHARDEN) -o $@ $(LIB_OBJS) $(PKG_LIBS) -lm
ALL_TARGETS += $(LIBMMGUARD_SO)
