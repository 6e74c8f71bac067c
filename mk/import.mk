# mk/import.mk - `mmguard import` on the published files of real jobs
# (tests/import/run.sh reads tests/fixtures/import: HF configs, LLaVA's and
# LLaMA-Factory's DeepSpeed configs, flags and YAMLs), plain and under
# ASan+UBSan; and the catalog of HF ids installed beside the presets.
# Included by the top Makefile.
#
#   make check-import      the suite with build/mmguard and build/mmguard-asan
#   make install-import    contrib/models/catalog.txt under share/mmguard/models

IMPORT_DATA ?= tests/fixtures/import

CHECK_TARGETS   += check-import
INSTALL_TARGETS += install-import

.PHONY: check-import install-import

# the installed catalog is the default of `mmguard import` (import_catalog.c)
$(BUILD)/obj/import/import_catalog.o $(BUILD)/asan/import/import_catalog.o: CFLAGS += -DMM_DATADIR='"$(PREFIX)/share/mmguard"'

check-import: $(BUILD)/mmguard $(BUILD)/mmguard-asan
	MMGUARD=$(BUILD)/mmguard IMPORT_DATA=$(IMPORT_DATA) sh tests/import/run.sh
	MMGUARD=$(BUILD)/mmguard-asan IMPORT_DATA=$(IMPORT_DATA) \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  sh tests/import/run.sh

install-import:
	install -d $(DESTDIR)$(PREFIX)/share/mmguard/models
	install -m 0644 contrib/models/catalog.txt $(DESTDIR)$(PREFIX)/share/mmguard/models/catalog.txt

# the import harnesses (FUZZ_HARNESSES in mk/fuzz.mk) share tests/fuzz/fuzz_import.h
$(addprefix $(FUZZ_DIR)/fuzz_,import_ds import_trainer import_args import_lf import_titan import_swift): tests/fuzz/fuzz_import.h
