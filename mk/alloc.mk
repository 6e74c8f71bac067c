# mk/alloc.mk - the caching-allocator model against real GPU traces
# (tests/alloc/run.sh; docs/allocator.md).  The hand-derived sequences are Check
# unit tests (tests/unit/test_alloc.c) and run with check-unit / check-asan.

.PHONY: check-alloc

check-alloc: $(BUILD)/mmguard $(BUILD)/mmguard-asan
	MMGUARD=$(BUILD)/mmguard sh tests/alloc/run.sh
	@echo "-- the same under ASan+UBSan"
	@MMGUARD=$(BUILD)/mmguard-asan ASAN_OPTIONS=detect_leaks=1 sh tests/alloc/run.sh \
	    >$(BUILD)/alloc-asan.log 2>&1 || { cat $(BUILD)/alloc-asan.log; exit 1; }
	@tail -1 $(BUILD)/alloc-asan.log

CHECK_TARGETS += check-alloc
