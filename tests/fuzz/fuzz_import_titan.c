/* fuzz_import_titan.c - libFuzzer: a torchtitan TOML job config (toml.c, then
 * import_titan*.c) through `mmguard import`, then the emitted spec.  The
 * model comes from model.flavor (8B through the catalog of the tree). */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import_with(data, size, "train.toml", imp_torchtitan_buffer, 0);
    return 0;
}
