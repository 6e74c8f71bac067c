# mk/python.mk - the job-side recorder (python/, issue 25): `pip install ./python`.
#
#   make check-python   install ./python (pinned flit_core, no dependencies) into
#                       $(BUILD)/python and run tests/python/ with the project's CPU
#                       venv (make truth-venv: torch + transformers), real steps
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

check-python:
	@if [ "$(PYREC_PY)" = "$(TRUTH_PY)" ]; then $(MAKE) --no-print-directory truth-venv; fi
	$(MAKE) --no-print-directory python-install
	PYTHONPATH=$(abspath $(PYREC_DIR)) $(PYREC_PY) tests/python/test_recorder.py

CHECK_TARGETS += check-python

# `mmguard report` on a recorded (synthetic) log of many jobs: the outcome
# section recomputed independently (tests/loop/test_report_loop.py)
.PHONY: check-loop
check-loop: $(BUILD)/mmguard
	python3 tests/loop/test_report_loop.py $(BUILD)/mmguard

CHECK_TARGETS += check-loop
