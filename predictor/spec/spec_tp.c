/* spec_tp.c (spec layer) - training.tensor_parallel against what the tensor
 * parallel model (train/parallel_tp.c) covers: a dense decoder alone, with
 * torchtitan's block plan (q/k/v/gate/up ColwiseParallel, o/down
 * RowwiseParallel), one tensor-parallel group (no data parallel beside it).
 * What the model does not cover is refused here with the reason.
 * training.sequence_parallel (torchtitan's SequenceParallel norms, embedding
 * and lm_head sharded on the vocabulary, loss parallel; train/parallel_tp.c)
 * needs a tensor-parallel group and the setup the truth rows measure. */
#include "spec_internal.h"

#include <stddef.h>

#define ULL(x) ((unsigned long long)(x))

static int tp_fail(dctx *c, const mm_node *at, const char *why, uint64_t tp)
{
    return key_fail(c, at, "training.tensor_parallel", "%llu: %s", ULL(tp), why);
}

/* the other strategies and features: none is modelled together with TP */
static int tp_strategy(dctx *c, const mm_node *at, const mm_spec *s)
{
    const training_spec *t = &s->training;
    uint64_t tp = t->tensor_parallel;
    if (t->data_parallel > 1)
        return tp_fail(c, at, "data parallel beside tensor parallel (a 2-D mesh: DDP or FSDP "
                              "over the TP groups) is not modelled; training.data_parallel must "
                              "be 1", tp);
    if (t->zero_stage || s->fsdp.version)
        return tp_fail(c, at, "tensor parallel with DeepSpeed ZeRO or FSDP is not modelled", tp);
    if (t->torch_compile)
        return tp_fail(c, at, "torch.compile of a tensor-parallel model is not measured, no "
                              "bound is shown", tp);
    if (t->autocast)
        return tp_fail(c, at, "torch.autocast with tensor parallel is not measured (the truth "
                              "rows run the model in bf16 or fp32)", tp);
    if (mm_spec_module(s, MOD_VISION) || mm_spec_module(s, MOD_CONNECTOR))
        return tp_fail(c, at, "tensor parallel is modelled for a decoder alone: the vision "
                              "tower and connector of a VLM have no plan here", tp);
    return 0;
}

static int any_layer(const layer_set *l)
{
    for (size_t i = 0; i < sizeof l->w / sizeof l->w[0]; i++)
        if (l->w[i])
            return 1;
    return 0;
}

/* the decoder: torchtitan's dense block, every sharded width divisible by the degree */
static int tp_decoder(dctx *c, const mm_node *at, const module_spec *d, uint64_t tp)
{
    if (d->lora.enabled)
        return tp_fail(c, at, "LoRA on a tensor-parallel decoder is not modelled", tp);
    if (d->quant != QUANT_NONE)
        return tp_fail(c, at, "a quantized base under tensor parallel is not modelled", tp);
    if (d->num_experts || any_layer(&d->cross))
        return tp_fail(c, at, "tensor parallel is modelled for dense decoders (no MoE experts, "
                              "no cross-attention layers)", tp);
    if (d->qkv_fused || d->mlp != MLP_GATED)
        return tp_fail(c, at, "the plan shards separate q/k/v and gate/up/down Linears; this "
                              "decoder has a fused qkv or a two-Linear MLP", tp);
    if (d->num_attention_heads % tp || d->num_key_value_heads % tp)
        return key_fail(c, at, "training.tensor_parallel",
                        "%llu does not divide the decoder's %llu attention / %llu key-value heads "
                        "(ColwiseParallel shards q/k/v by heads)",
                        ULL(tp), ULL(d->num_attention_heads), ULL(d->num_key_value_heads));
    if (d->intermediate_size % tp)
        return key_fail(c, at, "training.tensor_parallel",
                        "%llu does not divide the decoder's intermediate_size %llu",
                        ULL(tp), ULL(d->intermediate_size));
    return 0;
}

static int sp_fail(dctx *c, const mm_node *root, const char *why)
{
    return key_fail(c, mm_node_get(mm_node_get(root, "training"), "sequence_parallel"),
                    "training.sequence_parallel", "%s", why);
}

/* sequence parallel: torchtitan's whole plan (parallel_tp.c) as the truth rows measure it
 * (tests/truth/tp.py apply_sp): a Llama block, the embedding and lm_head sharded on the
 * vocabulary, loss_parallel around F.cross_entropy on the fp32 logits, sdpa */
static int tp_seq_check(dctx *c, const mm_node *root, const mm_spec *s, const module_spec *d)
{
    const training_spec *t = &s->training;
    uint64_t tp = t->tensor_parallel;
    attn_kind a = d->attention == ATT_INHERIT ? t->attention : d->attention;
    if (t->seq_len % tp)
        return sp_fail(c, root, "seq_len must be a multiple of tensor_parallel: the reduce-scatter "
                                "to the sequence shards asserts it (torch "
                                "_functional_collectives.py reduce_scatter_single)");
    if (d->vocab_size % tp)
        return sp_fail(c, root, "the vocabulary-sharded embedding and lm_head are modelled for a "
                                "vocab_size that tensor_parallel divides");
    if (d->tie_word_embeddings || (d->embedding_rows && d->embedding_rows != d->vocab_size))
        return sp_fail(c, root, "a tied (or resized) embedding under the vocabulary-sharded plan "
                                "is not modelled");
    if (d->scale_embeddings || d->sandwich_norm || d->layer_scale)
        return sp_fail(c, root, "the plan is torchtitan's Llama block; embedding scaling, sandwich "
                                "norms and layer scale are not modelled with it");
    if (t->loss != LOSS_STANDARD || !t->loss_upcast || t->logits_to_keep)
        return sp_fail(c, root, "loss_parallel is modelled for the standard cross-entropy on all "
                                "the fp32-upcast logits (no chunked / fused loss, loss_upcast "
                                "false or logits_to_keep)");
    if (a != ATT_SDPA || t->packing || t->liger.enabled)
        return sp_fail(c, root, "measured with sdpa's causal path on whole sequences only (the "
                                "model sees S/tp positions per rank: no mask from them), without "
                                "packing or Liger kernels");
    return 0;
}

int spec_check_tp(dctx *c, const mm_node *root, const mm_spec *s)
{
    uint64_t tp = s->training.tensor_parallel;
    if (s->training.sequence_parallel && tp <= 1)
        return key_fail(c, mm_node_get(mm_node_get(root, "training"), "sequence_parallel"),
                        "training.sequence_parallel",
                        "sequence parallelism shards the norms of a tensor-parallel group: it needs "
                        "training.tensor_parallel > 1");
    if (tp <= 1)
        return 0;
    const mm_node *at = mm_node_get(mm_node_get(root, "training"), "tensor_parallel");
    const module_spec *d = mm_spec_module(s, MOD_DECODER);
    if (tp_strategy(c, at, s))
        return -1;
    if (d && tp_decoder(c, at, d, tp))
        return -1;
    return d && s->training.sequence_parallel ? tp_seq_check(c, root, s, d) : 0;
}
