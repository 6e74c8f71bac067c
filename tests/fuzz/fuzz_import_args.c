/* fuzz_import_args.c - libFuzzer: trainer arguments as command-line flags
 * (shell words, quotes, continuations) through `mmguard import`. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import(data, size, "flags.txt", imp_args_buffer);
    return 0;
}
