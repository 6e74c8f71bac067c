/* decoder.c - the language model: token embedding [* sqrt(h) (Gemma)] ->
 * image features into the sequence (masked_scatter, LLaVA's per-sample cat, or
 * nothing for cross-attention) -> rotary cos/sin once per forward -> the masks
 * the attention needs -> layers (DeepStack features added after the first
 * ones) -> final norm -> lm_head and loss (ops_loss.c). */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* inputs_embeds.masked_scatter(image_mask, features): a new tensor; backward
 * keeps the (B, S, 1) bool mask */
static int32_t merge_images(lctx *c, int32_t emb, int32_t feat)
{
    const module_spec *m = c->m;
    uint64_t Th = op_mul(c, c->T, m->hidden_size);
    uint32_t rm = op_row(c, "merge_image_features", "masked_scatter");
    op_label(c, "merge image features", rm);
    int32_t mask = op_new(c, rm, c->T, 1);
    int32_t x = op_new(c, rm, Th, esz_of(c, emb));
    sim_node *n = op_node(c, rm, x, emb, feat, -1, 0);
    op_save(c, n, mask);
    op_drop(c, mask);
    if (c->input_grads && !op_rg(c, emb) && !c->counting)
        c->s->t[x].rg = 1;
    /* a frozen embedding's output that enable_input_require_grads made require
     * grad (output.requires_grad_(True), modeling_utils.py make_inputs_require_grads)
     * is a leaf: its AccumulateGrad node keeps the tensor (torch/csrc/autograd/
     * functions/accumulate_grad.h: `Variable variable`), and masked_scatter's
     * node keeps that node, until the backward passes it.  Not a leaf with a
     * trainable copy or LoRA on embed_tokens: their output requires grad already */
    const lora_spec *L = &c->m->lora;
    if (n && c->input_grads && !op_trainable(c) &&
        !(L->enabled && (L->save_embed || (L->targets & LT_EMBED))))
        op_save(c, n, emb);
    op_drop(c, emb);
    op_drop(c, feat);
    return x;
}

static int32_t embed(lctx *c, int32_t feat)
{
    const module_spec *m = c->m;
    uint64_t Th = op_mul(c, c->T, m->hidden_size);
    /* haotian-liu LLaVA embeds each sample's text on its own: with B > 1 each
     * later sample's V x h gradient is a temporary AccumulateGrad adds in */
    uint64_t llava = m->merge == MERGE_LLAVA && feat >= 0 && c->B > 1
                         ? op_mul3(c, m->vocab_size, m->hidden_size, c->gdt) : 0;
    uint64_t rows = m->embedding_rows ? m->embedding_rows : m->vocab_size;
    op_unit_event(c, OP_UNIT_EMBED, SIM_LAYER_BEGIN); /* embed_tokens' FSDP unit */
    int32_t emb = op_embedding(c, "embed_tokens", c->T, rows, m->hidden_size,
                               m->tie_word_embeddings, llava);
    op_unit_event(c, OP_UNIT_EMBED, SIM_LAYER_END);
    if (c->input_grads && !c->counting && emb >= 0)
        c->s->t[emb].rg = 1; /* enable_input_require_grads() */
    if (m->scale_embeddings) { /* * embed_scale: a new tensor */
        uint32_t r = op_row(c, "embed_tokens", "embedding");
        int32_t s = op_plain(c, r, emb, -1, Th, esz_of(c, emb));
        op_drop(c, emb);
        emb = s;
    }
    /* LoRA on embed_tokens wraps the whole module (its embed_scale included) */
    emb = op_lora_embedding(c, emb, c->T, rows, m->hidden_size);
    if (c->on_seq) { /* sequence parallel: the vocabulary-sharded lookup's partial sum,
                      * reduce-scattered to the sequence shards (train/parallel_tp.c) */
        int32_t e = c->on_seq(c, emb, 0, m->hidden_size);
        op_drop(c, emb);
        emb = e;
    }
    if (feat < 0 || m->merge == MERGE_CROSS_ATTENTION)
        return emb;
    return merge_images(c, emb, feat);
}

/* transformers 5.17 LlamaModel.forward (modeling_llama.py, and Mistral, Qwen2/3,
 * Mixtral, Gemma3Text, MllamaText alike) without position_ids given:
 * `torch.arange(S) + past_seen_tokens` - the arange and the int64 sum, then a
 * view (unsqueeze).  The sum is passed to every decoder layer, so a checkpointed
 * layer keeps it until its re-run (stack.c); otherwise it ends with the base
 * model's forward.  Qwen-VL text models get theirs from get_rope_index (not
 * modelled: -1); packed and sequence-parallel batches bring them as inputs. */
static void position_ids(lctx *c)
{
    const module_spec *m = c->m;
    const resolved_model *rm = c->rm;
    c->pos_ids = -1;
    if (m->pos != POS_ROPE || (rm->vision >= 0 && rm->modules[rm->vision].temporal_patch_size) ||
        c->on_seq || rm->training.packing)
        return;
    uint32_t r = op_row(c, "rotary_emb", "rope");
    int32_t a = op_new(c, r, c->S, 8);
    c->pos_ids = op_new(c, r, c->S, 8);
    op_drop(c, a);
}

/* rotary cos / sin (B, S, d), computed in fp32 and cast to the hidden dtype */
static void rotary(lctx *c, int32_t x)
{
    const module_spec *m = c->m;
    uint32_t rr = op_row(c, "rotary_emb", "rope");
    uint64_t e = op_mul3(c, c->B, c->S, m->head_dim), xe = esz_of(c, x);
    int32_t f = op_new(c, rr, e, F32); /* emb = cat(freqs, freqs) */
    int32_t cs = op_new(c, rr, e, F32), sn = op_new(c, rr, e, F32);
    op_drop(c, f);
    c->cos = cs;
    c->sin = sn;
    if (xe != F32) {
        c->cos = op_plain(c, rr, cs, -1, e, xe);
        op_drop(c, cs);
        c->sin = op_plain(c, rr, sn, -1, e, xe);
        op_drop(c, sn);
    }
}

/* create_causal_mask / create_sliding_window_causal_mask: eager gets float
 * (B, 1, S, S) masks; SDPA none unless is_causal cannot express it (sliding
 * window shorter than S, bidirectional images, packed sequences): then bool */
static void masks(lctx *c, int has_images)
{
    const module_spec *m = c->m;
    const training_spec *t = &c->rm->training;
    uint32_t r = op_row(c, "causal_mask", "mask");
    uint64_t ss = op_mul3(c, c->B, c->S, c->S);
    int sliding = c->rm->modules[c->mi].has_sliding && m->sliding_window < c->S;
    int special = (m->bidirectional_images && has_images) || (t->packing && c->attn == ATT_SDPA);
    c->mask = c->mask_sliding = -1;
    if (c->attn == ATT_EAGER) {
        c->mask = op_new(c, r, ss, esz_of(c, c->cos));
        if (sliding)
            c->mask_sliding = op_new(c, r, ss, esz_of(c, c->cos));
    } else if (c->attn == ATT_SDPA) {
        if (special)
            c->mask = op_new(c, r, ss, 1);
        if (sliding)
            c->mask_sliding = op_new(c, r, ss, 1);
    }
    /* Mllama _prepare_cross_attention_mask: an additive (B, 1, S, image tokens)
     * mask in the model dtype, for every attention kind */
    if (m->merge == MERGE_CROSS_ATTENTION && has_images)
        c->mask_cross = op_new(c, r, op_mul(c, op_mul(c, c->B, c->S),
                                      c->vt.seq * c->vt.tiles * (c->images / c->B)),
                         esz_of(c, c->cos));
}

/* use_cache without gradient checkpointing: every attention layer's k / v are
 * cat'ed into a DynamicCache (cache_utils.py DynamicLayer.update: a copy, in the
 * keys' dtype - fp32 after an fp32 rotary under autocast; a sliding layer keeps
 * a view of the full cat) that the model output holds until compute_loss
 * returns.  Allocated after the last layer: the forward's end is where it
 * counts (the loss). */
static void kv_cache(lctx *c)
{
    const module_spec *m = c->m;
    const training_spec *t = &c->rm->training;
    uint32_t r = op_row(c, "kv_cache", "cache");
    if (!t->use_cache || t->ckpt.enabled || c->counting)
        return;
    uint64_t ke = c->amp ? F32 : c->dt, kvd = op_mul(c, m->num_key_value_heads, m->head_dim);
    uint64_t img = c->vt.seq * c->vt.tiles * (c->B ? c->images / c->B : 0), n = 0;
    for (uint64_t l = 0; l < m->num_hidden_layers && l < MM_MAX_LAYERS; l++)
        n = sim_add(c->s, n, op_mul(c, c->B, (resolved_layer_kind(c->rm, c->mi, l) & LK_CROSS) ? img : c->S));
    op_label(c, "kv cache (use_cache)", r);
    int32_t kv = op_new(c, r, op_mul3(c, n, kvd, 2), ke);
    op_hold_forward(c, kv);
    op_drop(c, kv);
}

int32_t decoder_module(lctx *c, int32_t image_features)
{
    const module_spec *m = c->m;
    c->per_layer = 0;
    int has_images = image_features >= 0;
    if (m->merge == MERGE_CROSS_ATTENTION) {
        c->cross_states = image_features;
        image_features = -1;
    }
    op_unit_event(c, OP_UNIT_BASE, SIM_LAYER_BEGIN); /* the base model's FSDP unit */
    int32_t x = embed(c, image_features);
    position_ids(c);
    rotary(c, x);
    masks(c, has_images);
    c->per_layer = 1;
    x = stack_run(c, x, 0, m->num_hidden_layers, NULL);
    c->per_layer = 0;
    kv_cache(c);
    /* the forward's own references end here; checkpoints that saved them keep them */
    op_drop(c, c->cos);
    op_drop(c, c->sin);
    op_drop(c, c->mask);
    op_drop(c, c->mask_sliding);
    op_drop(c, c->cross_states);
    op_drop(c, c->mask_cross);
    c->cos = c->sin = c->mask = c->mask_sliding = c->cross_states = c->mask_cross = -1;
    for (size_t i = 0; i < c->ntaps; i++)
        op_drop(c, c->taps[i]);
    int32_t z = op_decoder_norm(c, "norm", x, c->on_seq ? c->T / c->seq_shards : c->T,
                                m->hidden_size, m->norm);
    op_drop(c, x);
    op_drop(c, c->pos_ids); /* the base model's forward returns */
    c->pos_ids = -1;
    op_unit_event(c, OP_UNIT_BASE, SIM_LAYER_END);
    if (c->on_seq) { /* lm_head's input all-gathered (ColwiseParallel input Shard(1)) */
        int32_t g = c->on_seq(c, z, 1, m->hidden_size);
        op_drop(c, z);
        z = g;
    }
    uint64_t rows = c->rm->training.logits_to_keep
                        ? op_mul(c, c->B, c->rm->training.logits_to_keep) : c->T;
    int32_t loss = op_lm_head_loss(c, z, rows, m->hidden_size, m->vocab_size,
                                   m->tie_word_embeddings);
    op_drop(c, z);
    return loss;
}
