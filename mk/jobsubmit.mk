# mk/jobsubmit.mk - contrib/job_submit.lua (admission check and resize at
# slurmctld) and its tests.  Included by the top Makefile.
#
#   make check-jobsubmit        Lua unit tests (no Slurm) + Lua-vs-C peak(N)
#                               + the real-Slurm test (root, tests/slurm/cluster.sh)
#   make check-jobsubmit-lua    only the tests that need no Slurm and no root
#   make install-jobsubmit      job_submit.lua as an example under share/mmguard

# Debian's slurm-wlm 22.05 runs job_submit.lua in Lua 5.1 (liblua5.1): the
# script is written for 5.1 and newer, and tested with every interpreter found.
LUA_VERSIONS    ?= lua5.1 lua5.3 lua5.4
LUA             ?= $(firstword $(foreach l,$(LUA_VERSIONS),$(shell command -v $(l) 2>/dev/null)))
JOBSUBMIT_LUA   := contrib/job_submit.lua
SLURM_PLUGIN_SO ?= $(BUILD)/spank_mmguard.so

CHECK_TARGETS   += check-jobsubmit
INSTALL_TARGETS += install-jobsubmit

.PHONY: check-jobsubmit check-jobsubmit-lua check-jobsubmit-peak check-jobsubmit-slurm install-jobsubmit

check-jobsubmit: check-jobsubmit-lua check-jobsubmit-peak check-jobsubmit-slurm

# Unit tests with a mock `slurm` table; every decision-log line they produce is
# then parsed by python3's json module (one object per line).
check-jobsubmit-lua: $(JOBSUBMIT_LUA) tests/jobsubmit/test_job_submit.lua
	@mkdir -p $(BUILD)
	@found=0; for lua in $(LUA_VERSIONS); do \
	  command -v $$lua >/dev/null 2>&1 || continue; found=1; \
	  echo "== $$lua"; rm -f $(BUILD)/jobsubmit-unit.jsonl; \
	  $$lua tests/jobsubmit/test_job_submit.lua $(JOBSUBMIT_LUA) $(BUILD)/jobsubmit-unit.jsonl || exit 1; \
	  python3 tests/jobsubmit/json_lines.py $(BUILD)/jobsubmit-unit.jsonl || exit 1; \
	done; [ $$found = 1 ] || { echo "no Lua interpreter ($(LUA_VERSIONS))"; exit 1; }

# The Lua peak(N) of the published record against the C library's
# mm_peak_for_dp() of the same record, N = 1..4096, for every shipped spec.
PEAK_TOOL := $(BUILD)/peak_tool
$(PEAK_TOOL): tests/jobsubmit/peak_tool.c spank_plugin/record.c spank_plugin/record.h $(BUILD)/libmmguard.a $(HDRS)
	$(CC) $(CFLAGS_ALL) -Ispank_plugin tests/jobsubmit/peak_tool.c spank_plugin/record.c $(BUILD)/libmmguard.a $(PKG_LIBS) -lm -o $@

PEAK_SPECS = $(filter-out %invalid.yaml,$(wildcard tests/jobsubmit/specs/*.yaml tests/slurm/specs/*.yaml contrib/models/*.yaml))
check-jobsubmit-peak: $(PEAK_TOOL) $(JOBSUBMIT_LUA)
	$(PEAK_TOOL) spec $(PEAK_SPECS) > $(BUILD)/peak_cases.txt
	@for lua in $(LUA_VERSIONS); do \
	  command -v $$lua >/dev/null 2>&1 || continue; echo "== $$lua"; \
	  $$lua tests/jobsubmit/peak_check.lua $(JOBSUBMIT_LUA) $(BUILD)/peak_cases.txt || exit 1; \
	done

# Real single-node Slurm with JobSubmitPlugins=lua and the SPANK plugin; needs root.
check-jobsubmit-slurm: $(BUILD)/mmguard $(SLURM_PLUGIN_SO) $(JOBSUBMIT_LUA) $(PEAK_TOOL)
	PLUGIN=$(abspath $(SLURM_PLUGIN_SO)) MMGUARD=$(abspath $(BUILD)/mmguard) PEAK_TOOL=$(abspath $(PEAK_TOOL)) \
	  JOB_SUBMIT_LUA=$(abspath $(JOBSUBMIT_LUA)) sh tests/slurm/test_jobsubmit.sh

install-jobsubmit:
	install -d $(DESTDIR)$(PREFIX)/share/mmguard/examples
	install -m 0644 $(JOBSUBMIT_LUA) $(DESTDIR)$(PREFIX)/share/mmguard/examples/job_submit.lua
