/* fuzz_import_lf.c - libFuzzer: a LLaMA-Factory train.yaml through
 * `mmguard import`, then the emitted spec. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import(data, size, "train.yaml", imp_llamafactory_buffer);
    return 0;
}
