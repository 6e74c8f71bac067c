/* fuzz_import_swift.c - libFuzzer: a shell script with a `swift sft` command
 * (import_swift*.c) through `mmguard import`, then the emitted spec.  The
 * fixed Qwen2-VL model of fuzz_import.h counts as given (--hf), so --model
 * is never resolved. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import(data, size, "sft.sh", imp_swift_buffer);
    return 0;
}
