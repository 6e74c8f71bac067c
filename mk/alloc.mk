# mk/alloc.mk - the caching-allocator model against real GPU traces
# (tests/alloc/run.sh; docs/allocator.md), and at a card's capacity: the invariants of
# the capacity-aware replay on those traces and every preset (tests/alloc/capacity.py), and
# against the capacity sweeps measured on a GPU (tests/alloc/sweep.py).  The hand-derived sequences are Check
# unit tests (tests/unit/test_alloc.c) and run with check-unit / check-asan.

.PHONY: check-alloc

check-alloc: $(BUILD)/mmguard $(BUILD)/mmguard-asan
	MMGUARD=$(BUILD)/mmguard sh tests/alloc/run.sh
	@echo "-- the same under ASan+UBSan"
	@MMGUARD=$(BUILD)/mmguard-asan ASAN_OPTIONS=detect_leaks=1 sh tests/alloc/run.sh \
	    >$(BUILD)/alloc-asan.log 2>&1 || { cat $(BUILD)/alloc-asan.log; exit 1; }
	@tail -1 $(BUILD)/alloc-asan.log
	@echo "-- on a card of limited memory (tests/alloc/capacity.py)"
	MMGUARD=$(BUILD)/mmguard python3 tests/alloc/capacity.py
	@echo "-- against capacity sweeps measured on a GPU (tests/alloc/sweep.py)"
	MMGUARD=$(BUILD)/mmguard python3 tests/alloc/sweep.py

CHECK_TARGETS += check-alloc
