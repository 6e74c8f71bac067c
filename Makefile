# mmguard top-level Makefile.
# Components add their own rules in mk/*.mk (plugin, slurm tests, oracle, fuzz, ...)
# and append to CHECK_TARGETS / ALL_TARGETS / INSTALL_TARGETS.
# BUILD may be overridden (make BUILD=build-x) so several builds can coexist.

BUILD   ?= build
PREFIX  ?= /usr/local
DESTDIR ?=
CC      ?= cc
PKG_CONFIG ?= pkg-config

PKGS      := json-c yaml-0.1
PKG_CFLAGS = $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes -Wvla
HARDEN   := -fstack-protector-strong -D_FORTIFY_SOURCE=2 -fPIC
CSTD     := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE
OPT      ?= -O2 -g
# the predictor's layers, lowest first (predictor/layers.txt): one folder each,
# every folder on the include path so a header is named without its layer
PRED_LAYERS := $(shell sed 's/\#.*//' predictor/layers.txt)
PRED_INC    := $(addprefix -Ipredictor/,$(PRED_LAYERS))
CFLAGS_ALL = $(CSTD) $(OPT) $(WARN) $(HARDEN) $(PKG_CFLAGS) $(PRED_INC) $(CFLAGS)
LDHARDEN := -Wl,-z,relro -Wl,-z,now -Wl,-z,noexecstack
ASAN     := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer
CFLAGS_ASAN = $(CSTD) -O1 -g $(WARN) -fPIC $(ASAN) $(PKG_CFLAGS) $(PRED_INC) $(CFLAGS)

LIB_SRCS := $(filter-out predictor/cli/%.c,$(wildcard predictor/*/*.c))
CLI_SRCS := $(wildcard predictor/cli/*.c)
HDRS     := $(wildcard predictor/*/*.h)

LIB_OBJS      := $(patsubst predictor/%.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
CLI_OBJS      := $(patsubst predictor/%.c,$(BUILD)/obj/%.o,$(CLI_SRCS))
LIB_OBJS_ASAN := $(patsubst predictor/%.c,$(BUILD)/asan/%.o,$(LIB_SRCS))
CLI_OBJS_ASAN := $(patsubst predictor/%.c,$(BUILD)/asan/%.o,$(CLI_SRCS))

ALL_TARGETS     := $(BUILD)/libmmguard.a $(BUILD)/mmguard
CHECK_TARGETS   :=
INSTALL_TARGETS :=

.PHONY: all check check-unit check-asan check-cli install clean deps deps-build bench accuracy demo
.DEFAULT_GOAL := all

# component fragments (spank plugin, slurm tests, oracle, fuzzing, ...)
-include $(sort $(wildcard mk/*.mk))

all: $(ALL_TARGETS)

$(BUILD)/obj/%.o: predictor/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/asan/%.o: predictor/%.c $(HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ASAN) -c $< -o $@

$(BUILD)/libmmguard.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libmmguard-asan.a: $(LIB_OBJS_ASAN)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/mmguard: $(CLI_OBJS) $(BUILD)/libmmguard.a
	$(CC) $(CFLAGS_ALL) -pie $(LDHARDEN) $(CLI_OBJS) $(BUILD)/libmmguard.a $(PKG_LIBS) -lm -o $@

$(BUILD)/mmguard-asan: $(CLI_OBJS_ASAN) $(BUILD)/libmmguard-asan.a
	$(CC) $(CFLAGS_ASAN) $(CLI_OBJS_ASAN) $(BUILD)/libmmguard-asan.a $(PKG_LIBS) -lm -o $@

# ---- unit tests (Check) -------------------------------------------------------
TEST_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_EXTRA_SRCS += tests/unit/unit_spec.c
CHECK_LIBS = $(shell $(PKG_CONFIG) --libs check 2>/dev/null)
CHECK_CFLAGS = $(shell $(PKG_CONFIG) --cflags check 2>/dev/null)

$(BUILD)/unit_tests: $(TEST_SRCS) $(UNIT_EXTRA_SRCS) tests/unit/unit.h $(BUILD)/libmmguard.a $(HDRS)
	$(CC) $(CFLAGS_ALL) $(CHECK_CFLAGS) -Itests/unit -Ispank_plugin -DSRCDIR='"$(CURDIR)"' $(TEST_SRCS) $(UNIT_EXTRA_SRCS) $(BUILD)/libmmguard.a $(PKG_LIBS) $(CHECK_LIBS) -lm -o $@

$(BUILD)/unit_tests-asan: $(TEST_SRCS) $(UNIT_EXTRA_SRCS) tests/unit/unit.h $(BUILD)/libmmguard-asan.a $(HDRS)
	$(CC) $(CFLAGS_ASAN) $(CHECK_CFLAGS) -Itests/unit -Ispank_plugin -DSRCDIR='"$(CURDIR)"' $(TEST_SRCS) $(UNIT_EXTRA_SRCS) $(BUILD)/libmmguard-asan.a $(PKG_LIBS) $(CHECK_LIBS) -lm -o $@

check-unit: $(BUILD)/unit_tests
	$(BUILD)/unit_tests

# CK_FORK=no so ASan sees every test in one process and reports leaks at exit.
check-asan: $(BUILD)/unit_tests-asan $(BUILD)/mmguard-asan
	CK_FORK=no ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(BUILD)/unit_tests-asan
	MMGUARD=$(BUILD)/mmguard-asan ASAN_OPTIONS=detect_leaks=1 sh tests/cli/run.sh

check-cli: $(BUILD)/mmguard
	MMGUARD=$(BUILD)/mmguard sh tests/cli/run.sh

# `make check` = what CI runs: install missing packages, build, every test suite.
check: deps
	$(MAKE) --no-print-directory all
	@mkdir -p $(BUILD)
	@sh mk/check_suites.sh "$(MAKE) --no-print-directory" $(BUILD) \
	    check-unit check-cli check-asan $(CHECK_TARGETS) 2>&1 | tee $(BUILD)/check.log
	@sh mk/check_summary.sh $(BUILD)/check.log "$$(cat $(BUILD)/check.rc)" $(BUILD)/check.times

deps:
	sh scripts/install-deps.sh build slurm oracle

deps-build:
	sh scripts/install-deps.sh build

# predictor speed: wall time (noisy on a shared VM) and, with valgrind,
# instructions per prediction (bench/instructions.sh), for a 7B LLaVA and the
# largest model of the catalog (Qwen2.5-VL-72B, 80 decoder layers)
BENCH_SPECS := contrib/models/llava-1.5-7b-finetune.yaml bench/qwen2.5-vl-72b-zero3.yaml
bench: $(BUILD)/mmguard
	@for s in $(BENCH_SPECS); do echo "== $$s"; $(BUILD)/mmguard bench $$s --iterations 300 || exit 1; done
	@if command -v valgrind >/dev/null; then MMGUARD=$(BUILD)/mmguard sh bench/instructions.sh $(BENCH_SPECS); \
	 else echo "(valgrind not installed: no instruction counts)"; fi

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/share/mmguard/models
	install -m 0755 $(BUILD)/mmguard $(DESTDIR)$(PREFIX)/bin/mmguard
	install -m 0644 $(BUILD)/libmmguard.a $(DESTDIR)$(PREFIX)/lib/libmmguard.a
	install -m 0644 predictor/base/mmguard.h $(DESTDIR)$(PREFIX)/include/mmguard.h
	install -m 0644 contrib/models/*.yaml $(DESTDIR)$(PREFIX)/share/mmguard/models/
	$(if $(INSTALL_TARGETS),$(MAKE) --no-print-directory $(INSTALL_TARGETS))

clean:
	rm -rf $(BUILD)
