# mk/presets.mk - the shipped model presets (contrib/models) against facts: exact parameter
# and trainable counts, the catalog of HF ids, round trips with the recipes' published files
# (IMPORT_DATA, tests/fixtures/import), and docs/models.md's generated table.
# Included by the top Makefile (mk/*.mk).
#
#   make check-presets   tests/presets/presets.py check, with build/mmguard and build/mmguard-asan
#   make models-doc      rewrite docs/models.md's table from the presets' predictions

IMPORT_DATA ?= tests/fixtures/import

CHECK_TARGETS += check-presets

.PHONY: check-presets models-doc

check-presets: $(BUILD)/mmguard $(BUILD)/mmguard-asan
	MMGUARD=$(BUILD)/mmguard IMPORT_DATA=$(IMPORT_DATA) python3 tests/presets/presets.py check
	MMGUARD=$(BUILD)/mmguard-asan IMPORT_DATA=$(IMPORT_DATA) \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  python3 tests/presets/presets.py check

models-doc: $(BUILD)/mmguard
	MMGUARD=$(BUILD)/mmguard python3 tests/presets/presets.py doc --write
