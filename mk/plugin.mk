# mk/plugin.mk - the Slurm SPANK plugin (spank_plugin/), its real-Slurm tests,
# the demo and the sbatch overhead benchmark.  Included by the top Makefile.
#
# spank_mmguard.so links libmmguard.a (built -fPIC) plus json-c and libyaml,
# never libslurm: the spank_* / slurm_* symbols come from the host process
# (sbatch, salloc, srun, slurmd, slurmstepd).  A linker version script keeps
# everything but slurm_spank_* and plugin_* local.

PLUGIN_SRCS := $(wildcard spank_plugin/*.c)
PLUGIN_HDRS := $(wildcard spank_plugin/*.h) $(HDRS)
PLUGIN_OBJS := $(patsubst spank_plugin/%.c,$(BUILD)/plugin/%.o,$(PLUGIN_SRCS))
PLUGIN_LDS  := spank_plugin/spank_mmguard.lds
PLUGIN_SO   := $(BUILD)/spank_mmguard.so
SLURM_PLUGINDIR ?= $(PREFIX)/lib/slurm
SLURM_SYSCONFDIR ?= /etc/slurm

ALL_TARGETS     += $(PLUGIN_SO)
CHECK_TARGETS   += check-slurm check-plugin-structure check-plugin-docs
INSTALL_TARGETS += install-plugin
# the Slurm-free parts are unit-tested (tests/unit/test_config.c, test_request.c,
# test_record.c, test_memreq.c) and fuzzed (tests/fuzz/fuzz_config.c,
# fuzz_request.c, fuzz_record.c, fuzz_memreq.c)
PLUGIN_PURE_SRCS := spank_plugin/config.c spank_plugin/request.c spank_plugin/walk.c \
                    spank_plugin/optable.c spank_plugin/script.c spank_plugin/reqtext.c \
                    spank_plugin/jobinfo.c spank_plugin/record.c spank_plugin/memreq.c \
                    spank_plugin/outcome_rec.c
UNIT_EXTRA_SRCS += $(PLUGIN_PURE_SRCS) tests/unit/case_table.c

.PHONY: plugin check-slurm check-plugin-structure check-plugin-docs demo bench-sbatch bench-sbatch-instructions install-plugin

plugin: $(PLUGIN_SO)

$(BUILD)/plugin/%.o: spank_plugin/%.c $(PLUGIN_HDRS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -Ispank_plugin -c $< -o $@

$(PLUGIN_SO): $(PLUGIN_OBJS) $(BUILD)/libmmguard.a $(PLUGIN_LDS)
	$(CC) -shared $(LDHARDEN) -Wl,--version-script=$(PLUGIN_LDS) -Wl,--exclude-libs,ALL \
	  -o $@ $(PLUGIN_OBJS) $(BUILD)/libmmguard.a $(PKG_LIBS) -lm

# The GPU request as the plugin rebuilds it, printed (tests/slurm/test_request.sh
# holds it against slurmctld's record of the same submission).
REQUEST_TOOL := $(BUILD)/request_tool
$(REQUEST_TOOL): tests/slurm/request_tool.c $(PLUGIN_PURE_SRCS) $(PLUGIN_HDRS)
	$(CC) $(CFLAGS_ALL) -Ispank_plugin tests/slurm/request_tool.c $(filter-out %config.c %record.c %outcome_rec.c,$(PLUGIN_PURE_SRCS)) -o $@

# No two files of the plugin call each other (tests/check/test_structure.sh).
check-plugin-structure: $(PLUGIN_OBJS)
	sh tests/check/test_structure.sh $(BUILD)/plugin

# What the review found wrong in the plugin's docs, held against the code.
check-plugin-docs: $(BUILD)/mmguard
	sh tests/check/test_docs.sh $(BUILD)/mmguard

# Real single-node Slurm (munged, slurmctld, slurmd) on loopback; needs root.
check-slurm: $(PLUGIN_SO) $(BUILD)/mmguard $(REQUEST_TOOL)
	PLUGIN=$(abspath $(PLUGIN_SO)) MMGUARD_CLI=$(abspath $(BUILD)/mmguard) sh tests/slurm/test_plugin.sh
	PLUGIN=$(abspath $(PLUGIN_SO)) REQUEST_TOOL=$(abspath $(REQUEST_TOOL)) \
	  JOB_SUBMIT_LUA=$(abspath contrib/job_submit.lua) sh tests/slurm/test_request.sh
	PLUGIN=$(abspath $(PLUGIN_SO)) JOB_SUBMIT_LUA=$(abspath contrib/job_submit.lua) \
	  sh tests/slurm/test_hostmem.sh
	PLUGIN=$(abspath $(PLUGIN_SO)) MMGUARD_CLI=$(abspath $(BUILD)/mmguard) sh tests/slurm/test_outcome.sh
	PLUGIN=$(abspath $(PLUGIN_SO)) sh tests/slurm/test_tp.sh

demo:
	sh scripts/install-deps.sh build slurm
	$(MAKE) --no-print-directory $(PLUGIN_SO) $(BUILD)/mmguard
	PLUGIN=$(abspath $(PLUGIN_SO)) MMGUARD_CLI=$(abspath $(BUILD)/mmguard) sh scripts/demo.sh

BENCH_N ?= 50
bench-sbatch: $(PLUGIN_SO)
	PLUGIN=$(abspath $(PLUGIN_SO)) N=$(BENCH_N) sh bench/sbatch_bench.sh

# instructions sbatch executes without / with the plugin (callgrind); BASE_PLUGIN=
# an older spank_mmguard.so to compare with
bench-sbatch-instructions: $(PLUGIN_SO)
	PLUGIN=$(abspath $(PLUGIN_SO)) sh bench/sbatch_instructions.sh

install-plugin: $(PLUGIN_SO)
	install -d $(DESTDIR)$(SLURM_PLUGINDIR) $(DESTDIR)$(PREFIX)/share/mmguard
	install -m 0755 $(PLUGIN_SO) $(DESTDIR)$(SLURM_PLUGINDIR)/spank_mmguard.so
	install -m 0644 plugstack.conf.example mmguard.conf.example slurm.conf.example \
	  $(DESTDIR)$(PREFIX)/share/mmguard/
