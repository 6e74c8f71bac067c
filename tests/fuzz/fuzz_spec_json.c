/* fuzz_spec_json.c - libFuzzer: JSON spec loader, then predict + JSON. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_load_spec(data, size, "fuzz.json", MM_FMT_JSON);
    return 0;
}
