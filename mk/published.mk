# Published measurements (tests/published, issue 14): the predictor against peak-memory
# figures other people published with their setup.  A cross-check, not a goal: the
# errors never fail a target.  check-published only verifies that every row is complete
# and sourced and that every spec loads; docs/published.md's table is generated.
#
#   make published          the table (also printed by `make accuracy`)
#   make published-doc      rewrite the generated part of docs/published.md
#   make check-published    rows complete, sources named, specs load (in `make check`)

PUBLISHED_PY  ?= python3
PUBLISHED     := tests/published/published.py
PUBLISHED_DOC := docs/published.md

.PHONY: published published-doc check-published check-published-doc

published: $(BUILD)/mmguard
	@$(PUBLISHED_PY) $(PUBLISHED) --mmguard $(BUILD)/mmguard
	@$(PUBLISHED_PY) $(PUBLISHED) --mmguard $(BUILD)/mmguard --check-doc $(PUBLISHED_DOC) || true

published-doc: $(BUILD)/mmguard
	$(PUBLISHED_PY) $(PUBLISHED) --mmguard $(BUILD)/mmguard --write-doc $(PUBLISHED_DOC)

# not in CHECK_TARGETS: a predictor change makes the doc stale without anything being wrong
check-published-doc: $(BUILD)/mmguard
	$(PUBLISHED_PY) $(PUBLISHED) --mmguard $(BUILD)/mmguard --check-doc $(PUBLISHED_DOC)

check-published: $(BUILD)/mmguard
	$(PUBLISHED_PY) $(PUBLISHED) --mmguard $(BUILD)/mmguard --check

CHECK_TARGETS += check-published
