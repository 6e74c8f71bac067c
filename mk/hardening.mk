# mk/hardening.mk - hardening tests of the SPANK plugin on a real single-node
# Slurm (tests/slurm/cluster.sh; root).  Included by the top Makefile.
#
#   make check-load     200 sbatch --mm-model submissions, 20 at a time (accepted,
#                       rejected, invalid, plain): outcomes, one intact JSON
#                       decision-log line per decision, submissions/s
#   make check-faults   unwritable decision log, spec changed/removed/unreadable/
#                       FIFO/directory, root-only spec leak, misconfiguration,
#                       slurmctld restart (docs/hardening.md)
#   make check-summary  the last line of `make check` names skipped checks
#   make bench-load     check-load with LOAD_BENCH_N=500 submissions per row, LOAD_BENCH_ROUNDS=3
#                       interleaved rounds (plugin not loaded / loaded)

# (plugin.mk, which defines the plugin rules, is included after this file)
CHECK_TARGETS += check-load check-faults check-summary

LOAD_N         ?= 200
LOAD_P         ?= 20
LOAD_BENCH_N   ?= 500
LOAD_BENCH_ROUNDS ?= 3

.PHONY: check-load check-faults bench-load check-summary

# the last line of `make check` says what was skipped (mk/check_summary.sh)
check-summary:
	sh tests/check/test_check_summary.sh

check-load: $(BUILD)/spank_mmguard.so
	PLUGIN=$(abspath $(BUILD)/spank_mmguard.so) N=$(LOAD_N) P=$(LOAD_P) sh tests/slurm/test_load.sh

check-faults: $(BUILD)/spank_mmguard.so
	PLUGIN=$(abspath $(BUILD)/spank_mmguard.so) sh tests/slurm/test_faults.sh

bench-load: $(BUILD)/spank_mmguard.so
	PLUGIN=$(abspath $(BUILD)/spank_mmguard.so) N=$(LOAD_BENCH_N) P=$(LOAD_P) ROUNDS=$(LOAD_BENCH_ROUNDS) sh tests/slurm/test_load.sh
