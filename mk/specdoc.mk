# mk/specdoc.mk - docs/spec-keys.md is generated from the spec loader's key
# tables (scripts/spec_keys.py): every accepted key, its type, range and where
# it applies.  check-spec-doc fails when the page and the tables disagree.
#
#   make spec-doc        rewrite docs/spec-keys.md
#   make check-spec-doc  compare

.PHONY: spec-doc check-spec-doc

spec-doc:
	python3 scripts/spec_keys.py --write

check-spec-doc:
	python3 scripts/spec_keys.py --check

CHECK_TARGETS += check-spec-doc
