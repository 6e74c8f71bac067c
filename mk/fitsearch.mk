# mk/fitsearch.mk - the largest micro-batch the plugin publishes
# (mm_max_micro_batch, predictor/api/fit.c) against a plain bisection by
# `mmguard check`'s verdict, on every shipped preset at five cards and both
# flush policies (tests/fit/fit_search.c; a few minutes).
#
#   make check-fit-search

FIT_SEARCH := $(BUILD)/fit_search
$(FIT_SEARCH): tests/fit/fit_search.c $(BUILD)/libmmguard.a $(HDRS)
	$(CC) $(CFLAGS_ALL) tests/fit/fit_search.c $(BUILD)/libmmguard.a $(PKG_LIBS) -lm -o $@

.PHONY: check-fit-search
check-fit-search: $(FIT_SEARCH)
	$(FIT_SEARCH) contrib/models/*.yaml

CHECK_TARGETS += check-fit-search
