/* fuzz_spec_yaml.c - libFuzzer: YAML spec loader, then predict + JSON. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_load_spec(data, size, "fuzz.yaml", MM_FMT_YAML);
    return 0;
}
