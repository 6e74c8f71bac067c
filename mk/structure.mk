# mk/structure.mk - the predictor's shape (issue 24, docs/architecture.md): its
# layers, lowest first, are the folders listed in predictor/layers.txt; no file
# uses a symbol of, or includes a header of, a higher layer, and no two files use
# each other (tests/check/test_layers.sh, from the objects' own symbols).  The
# plugin's own test is check-plugin-structure (mk/plugin.mk).  Included by the
# top Makefile.

CHECK_TARGETS += check-structure

.PHONY: check-structure

check-structure: $(LIB_OBJS) $(CLI_OBJS)
	sh tests/check/test_layers.sh $(BUILD)/obj predictor
