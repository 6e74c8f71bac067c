# mk/fuzz.mk - libFuzzer harnesses (tests/fuzz/) and the valgrind run.
# Included by the top Makefile.
#
#   make fuzz [FUZZ_SECONDS=60]   every harness for FUZZ_SECONDS, fails on any
#                                 crash, leak, timeout or out-of-memory
#   make check-fuzz               regressions + ~10 s per harness, FUZZ_JOBS (2) at a
#                                 time (in `make check`)
#   make fuzz-build               only build $(BUILD)/fuzz/fuzz_*
#   make valgrind                 unit tests (CK_FORK=no) + CLI on contrib specs
#                                 under valgrind --leak-check=full
#
# The harnesses are built with clang from the library sources directly (not
# from libmmguard.a, which is gcc-built and uninstrumented): every object is
# compiled with -fsanitize=fuzzer-no-link,address,undefined so libFuzzer sees
# the coverage of the parsers it is attacking.  Working corpora grow under
# $(BUILD)/fuzz/corpus/<harness>; the committed seeds in tests/fuzz/corpus/
# are read-only inputs (the ms-swift and torchtitan readers are seeded with their
# import fixtures themselves, tests/fixtures/import/{ms-swift,torchtitan}, the
# config.json reader with every fixture directory holding one).  Crash/leak/timeout reproducers land in
# $(BUILD)/fuzz/artifacts/.  Every file in tests/fuzz/regressions/<harness>/
# is replayed first.

FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 60
FUZZ_CHECK_SECONDS ?= 10
FUZZ_HARNESSES := spec_yaml spec_json set config size alloc request record import_ds import_trainer import_args import_lf import_titan import_swift import_hf memreq outcome report
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS    = $(CSTD) -O1 -g $(WARN) $(FUZZ_SAN) $(PKG_CFLAGS) $(PRED_INC) -Ispank_plugin $(CFLAGS)
FUZZ_DIR      := $(BUILD)/fuzz
FUZZ_LIB_OBJS := $(patsubst predictor/%.c,$(FUZZ_DIR)/obj/%.o,$(LIB_SRCS))
FUZZ_BINS     := $(addprefix $(FUZZ_DIR)/fuzz_,$(FUZZ_HARNESSES))
# libFuzzer flags shared by every run: per-input time limit, memory cap, spec-sized inputs
FUZZ_RUN_FLAGS ?= -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=16384 \
                  -print_final_stats=1
FUZZ_ENV      := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 \
                 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: fuzz check-fuzz fuzz-build fuzz-deps fuzz-regressions valgrind

CHECK_TARGETS += check-fuzz

fuzz-deps:
	sh scripts/install-deps.sh fuzz

$(FUZZ_DIR)/obj/%.o: predictor/%.c $(HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/obj/config.o: spank_plugin/config.c spank_plugin/config.h $(HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_config: tests/fuzz/fuzz_config.c tests/fuzz/fuzz_common.h $(FUZZ_DIR)/obj/config.o $(FUZZ_LIB_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_DIR)/obj/config.o $(FUZZ_LIB_OBJS) $(PKG_LIBS) -lm -o $@

# the plugin's Slurm-free readers: the GPU request and the MMGUARD record
FUZZ_REQ_SRCS := spank_plugin/request.c spank_plugin/walk.c spank_plugin/optable.c \
                 spank_plugin/script.c spank_plugin/reqtext.c spank_plugin/jobinfo.c
FUZZ_REQ_OBJS := $(patsubst spank_plugin/%.c,$(FUZZ_DIR)/plugin/%.o,$(FUZZ_REQ_SRCS))
$(FUZZ_DIR)/plugin/%.o: spank_plugin/%.c $(wildcard spank_plugin/*.h) $(HDRS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_request: tests/fuzz/fuzz_request.c tests/fuzz/fuzz_common.h tests/fuzz/fuzz_split.h $(FUZZ_REQ_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_REQ_OBJS) -o $@

$(FUZZ_DIR)/fuzz_memreq: tests/fuzz/fuzz_memreq.c tests/fuzz/fuzz_common.h tests/fuzz/fuzz_split.h $(FUZZ_REQ_OBJS) $(FUZZ_DIR)/plugin/memreq.o
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_REQ_OBJS) $(FUZZ_DIR)/plugin/memreq.o -o $@

$(FUZZ_DIR)/fuzz_record: tests/fuzz/fuzz_record.c tests/fuzz/fuzz_common.h $(FUZZ_DIR)/plugin/record.o $(FUZZ_LIB_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_DIR)/plugin/record.o $(FUZZ_LIB_OBJS) $(PKG_LIBS) -lm -o $@

# the job's record (issue 25): read by slurmstepd as root from a file the user wrote
$(FUZZ_DIR)/fuzz_outcome: tests/fuzz/fuzz_outcome.c tests/fuzz/fuzz_common.h $(FUZZ_DIR)/plugin/outcome_rec.o
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_DIR)/plugin/outcome_rec.o $(PKG_LIBS) -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB_OBJS)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJS) $(PKG_LIBS) -lm -o $@

fuzz-build: fuzz-deps
	$(MAKE) --no-print-directory $(FUZZ_BINS)

# Replay every committed regression input (fails if one still crashes/leaks).
fuzz-regressions: fuzz-build
	@for h in $(FUZZ_HARNESSES); do \
	  files=$$(ls tests/fuzz/regressions/$$h/* 2>/dev/null); \
	  [ -n "$$files" ] || continue; \
	  echo "== regressions fuzz_$$h: $$(echo $$files | wc -w) inputs"; \
	  $(FUZZ_ENV) $(FUZZ_DIR)/fuzz_$$h $(FUZZ_RUN_FLAGS) $$files > $(FUZZ_DIR)/regressions_$$h.log 2>&1 \
	    || { tail -n 60 $(FUZZ_DIR)/regressions_$$h.log; echo "fuzz_$$h: a regression input fails again"; exit 1; }; \
	done

# Each harness for $(1) seconds, FUZZ_JOBS at a time (each is one process on one
# core: two at once on a 2-core machine halves the wall time and keeps each run's
# length); no harness starts after one fails (mk/fuzz_one.sh).
FUZZ_JOBS ?= 2
define fuzz_run
	@printf '%s\n' $(FUZZ_HARNESSES) | \
	  FUZZ_DIR=$(FUZZ_DIR) FUZZ_RUN_FLAGS="$(FUZZ_RUN_FLAGS)" $(FUZZ_ENV) \
	  xargs -P $(FUZZ_JOBS) -n 1 sh mk/fuzz_one.sh $(1)
endef

fuzz: fuzz-regressions
	$(call fuzz_run,$(FUZZ_SECONDS))

check-fuzz: fuzz-regressions
	$(call fuzz_run,$(FUZZ_CHECK_SECONDS))

# ---- valgrind -----------------------------------------------------------------
VALGRIND := valgrind -q --leak-check=full --error-exitcode=1 --errors-for-leak-kinds=definite,indirect

valgrind: fuzz-deps
	$(MAKE) --no-print-directory $(BUILD)/unit_tests $(BUILD)/mmguard
	CK_FORK=no $(VALGRIND) $(BUILD)/unit_tests
	@for f in contrib/models/*.yaml; do \
	  echo "== valgrind mmguard predict $$f"; \
	  $(VALGRIND) $(BUILD)/mmguard predict $$f --json > /dev/null || exit 1; \
	done
