/* fuzz_set.c - libFuzzer: `--set` overrides.  The input is split at '\n' into
 * assignments applied in order to a fixed valid spec (all three module types,
 * LoRA, deepspeed and device sections); after each accepted one the spec is
 * predicted and rendered.  A refused assignment must leave the spec unchanged. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char BASE[] =
    "name: fuzz-base\n"
    "modules:\n"
    "  - {name: vision_tower, type: vit, hidden_size: 64, num_hidden_layers: 2,\n"
    "     num_attention_heads: 4, intermediate_size: 128, image_size: 56, patch_size: 14,\n"
    "     trainable: false}\n"
    "  - {name: projector, type: mlp, input_size: 64, hidden_size: 128, num_layers: 2,\n"
    "     activation: gelu}\n"
    "  - name: language_model\n"
    "    type: llama\n"
    "    hidden_size: 128\n"
    "    num_hidden_layers: 2\n"
    "    num_attention_heads: 4\n"
    "    num_key_value_heads: 2\n"
    "    intermediate_size: 256\n"
    "    vocab_size: 1000\n"
    "    trainable: false\n"
    "    lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}\n"
    "training: {micro_batch_size: 2, seq_len: 256, precision: bf16, optimizer: adamw,\n"
    "           zero_stage: 2, data_parallel: 4, gradient_checkpointing: true,\n"
    "           attention: flash}\n"
    "framework: {transformers_version: \"4.37.2\", torch_version: \"2.12\",\n"
    "            deepspeed_version: \"0.19.8\"}\n"
    "deepspeed: {overlap_comm: true}\n"
    "device: {cuda_context: 512MiB, nccl: 1GiB}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(BASE, sizeof BASE - 1, "base.yaml", MM_FMT_YAML, &e);
    if (!s)
        FUZZ_FAIL("contract at this line"); /* the base spec is valid */
    char *in = malloc(size + 1);
    if (!in)
        FUZZ_FAIL("contract at this line");
    memcpy(in, data, size);
    in[size] = '\0';
    int applied = 0;
    for (char *line = in, *nl; line; line = nl) {
        nl = strchr(line, '\n');
        if (nl)
            *nl++ = '\0';
        char before[65];
        memcpy(before, mm_spec_digest(s), sizeof before);
        uint32_t mb = mm_spec_micro_batch(s), dp = mm_spec_data_parallel(s);
        if (mm_spec_set(s, line, &e) != 0) {
            fuzz_check_error(&e);
            if (e.msg[0] == '\0')
                FUZZ_FAIL("contract at this line");
            /* unchanged on error */
            if (mm_spec_micro_batch(s) != mb || mm_spec_data_parallel(s) != dp ||
                strcmp(before, mm_spec_digest(s)) != 0)
                FUZZ_FAIL("contract at this line");
            continue;
        }
        applied++;
    }
    if (applied) {
        fuzz_predict(s);
        /* a clone is the same spec (predicting it again would halve the speed) */
        mm_spec *c = mm_spec_clone(s);
        if (c) {
            if (strcmp(mm_spec_name(c), mm_spec_name(s)) != 0 ||
                mm_spec_micro_batch(c) != mm_spec_micro_batch(s) ||
                mm_spec_data_parallel(c) != mm_spec_data_parallel(s) ||
                mm_spec_zero_stage(c) != mm_spec_zero_stage(s) ||
                mm_spec_checkpointing(c) != mm_spec_checkpointing(s))
                FUZZ_FAIL("contract at this line");
            mm_spec_free(c);
        }
    }
    free(in);
    mm_spec_free(s);
    return 0;
}
