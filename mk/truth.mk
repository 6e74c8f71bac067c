# Real-library CPU oracle (tests/truth): transformers / PEFT / torch.distributed
# measured on the CPU with an exact byte-counting allocator.  See docs/oracle.md.
#
#   make truth-venv     build/truth-venv from deps/truth-requirements.txt (idempotent)
#   make truth          (re)generate tests/truth/data/truth.jsonl (resumable, slow)
#   make check-truth    CI smoke test of the oracle itself (selftests + 3 tiny configs)

TRUTH_PYTHON   ?= python3
TRUTH_VENV     ?= $(BUILD)/truth-venv
TRUTH_PY       := $(TRUTH_VENV)/bin/python
TRUTH_REQ      := deps/truth-requirements.txt
TRUTH_BUILD_REQ := deps/truth-build-requirements.txt
TRUTH_DATA     ?= tests/truth/data/truth.jsonl
TRUTH_ARGS     ?=
TRUTH_TIMEOUT  ?= 600

.PHONY: truth truth-venv check-truth

# The stamp depends on the requirements files, so editing the pins rebuilds.
# The pinned build tools go in first (DeepSpeed is built from its sdist in the venv);
# then torch, alone, --no-index from pip's find-links (the +cpu wheel),
# so pip never resolves PyPI's multi-GB CUDA build; the checks fail otherwise.
$(TRUTH_VENV)/.stamp: $(TRUTH_REQ) $(TRUTH_BUILD_REQ)
	rm -rf $(TRUTH_VENV)
	$(TRUTH_PYTHON) -m venv $(TRUTH_VENV)
	$(TRUTH_PY) -m pip install --quiet -r $(TRUTH_BUILD_REQ)
	$(TRUTH_PY) -m pip install --quiet --no-index --no-deps "$$(grep -E '^torch==' $(TRUTH_REQ))+cpu" || \
	  { echo "truth-venv: no CPU wheel of $$(grep -E '^torch==' $(TRUTH_REQ)) in pip's find-links (PIP_FIND_LINKS); refusing PyPI's CUDA build"; exit 1; }
	DS_BUILD_OPS=0 $(TRUTH_PY) -m pip install --quiet --no-build-isolation -r $(TRUTH_REQ)
	$(TRUTH_PY) -c "import torch,sys; v=torch.__version__; print('truth-venv: torch', v); sys.exit(0 if v.endswith('+cpu') else 'not a +cpu torch: '+v)"
	touch $@

truth-venv: $(TRUTH_VENV)/.stamp

truth: truth-venv
	nice -n 10 $(TRUTH_PY) tests/truth/truth.py generate --out $(TRUTH_DATA) --timeout $(TRUTH_TIMEOUT) $(TRUTH_ARGS)

# Fails when the venv cannot be built, unless TRUTH_SKIP_OK=1, which turns that
# into a printed "check-truth: skipped: ..." line (so `make check` still shows it).
check-truth:
	@mkdir -p $(BUILD); if $(MAKE) --no-print-directory truth-venv >$(BUILD)/truth-venv.log 2>&1; then \
	  $(TRUTH_PY) tests/truth/selftest.py; \
	else \
	  tail -20 $(BUILD)/truth-venv.log; \
	  if [ "$(TRUTH_SKIP_OK)" = 1 ]; then echo "check-truth: skipped: could not build $(TRUTH_VENV) from PyPI (see $(BUILD)/truth-venv.log)"; \
	  else echo "check-truth: FAILED: could not build $(TRUTH_VENV) (see $(BUILD)/truth-venv.log)"; exit 1; fi; \
	fi

CHECK_TARGETS += check-truth
