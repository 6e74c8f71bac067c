/* fuzz_import_hf.c - libFuzzer: a Hugging Face config.json (import_hf*.c:
 * the language model, the vision tower and connector, a pre-quantized
 * checkpoint's quantization_config) through `mmguard import`, then the
 * emitted spec.  Seeded with the published configs of
 * tests/fixtures/import and tests/fuzz/corpus/import_hf. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int hf_reader(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    return imp_hf_buffer(j->s, buf, len, name, NULL, 0, NULL, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import_with(data, size, "config.json", hf_reader, 0);
    return 0;
}
