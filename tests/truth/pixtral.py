"""Truth rows for the Pixtral family (issue 23): transformers' LlavaForConditionalGeneration with a
`pixtral` vision config (models/pixtral/modeling_pixtral.py PixtralVisionModel: patch conv 16
without bias, RMSNorm ln_pre, axial 2-D rotary over each image's patch grid, every image of the
batch in one sequence with generate_block_attention_mask's (1, 1, P, P) mask in the model dtype,
SiLU-gated MLP), the LLaVA projector and a Mistral LM, as mistral-community/pixtral-12b is built.

Images keep their own size: PixtralImageProcessor resizes the longest edge to at most
size.longest_edge and rounds each side up to a multiple of patch_size
(image_processing_pil_pixtral.py get_resize_output_image_size), so a 96 x 160 image with
longest_edge 128 becomes 80 x 128 (5 x 8 patches).  The LM sequence carries the image's
[IMG] tokens contiguously (what reaches the model is the same: [IMG_BREAK] / [IMG_END] are
ordinary text tokens, processing_pixtral.py).

Tiny on purpose (2 shared CPU cores): vision 64 wide, LM 128 wide.

    FAMILY               "pixtral" and "mistral3", registered in families.py (one import line there)
    setups()             the rows, called by ONE line of truth.py config_list
"""
import families

LONGEST = 128       # size.longest_edge of the tiny processor (pixtral-12b: 1024)


@families.family("pixtral", "LlavaForConditionalGeneration", "llava")
def _pixtral(p):
    h = p.get("hidden", 128)
    vocab = families.vocab_for(h, 102.4)       # Mistral-Nemo tekken 131072 / 5120 (pixtral-12b)
    img_tok, brk_tok, end_tok = families._top_ids(vocab, 3)
    vh = p.get("vhidden", 64)
    longest = p.get("longest", LONGEST)
    cfg = dict(
        image_token_index=img_tok, projector_hidden_act="gelu", vision_feature_layer=-1,
        vision_feature_select_strategy="full", tie_word_embeddings=False, multimodal_projector_bias=True,
        vision_config=dict(model_type="pixtral", hidden_size=vh, intermediate_size=vh * 4,
                           num_hidden_layers=p.get("vlayers", 2), num_attention_heads=vh // 32,
                           image_size=longest, patch_size=16, hidden_act="silu",
                           rope_parameters={"rope_type": "axial", "rope_theta": 10000.0}),
        # Mistral-Nemo 12B: 32 q / 8 kv heads, head_dim 128 (< hidden / heads), untied
        text_config=families.text_cfg(dict(model_type="mistral"), h, p.get("layers", 2), 4, 1, h * 3, vocab,
                                      head_dim=32, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                      rope_theta=1e6, sliding_window=None),
    )
    proc = ("PixtralImageProcessor", dict(size={"longest_edge": longest}, patch_size={"height": 16, "width": 16},
                                          image_mean=[0.48145466, 0.4578275, 0.40821073],
                                          image_std=[0.26862954, 0.26130258, 0.27577711]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="plain")


@families.family("mistral3", "Mistral3ForConditionalGeneration", "mistral3")
def _mistral3(p):
    """Mistral-Small-3.1's layout (models/mistral3): the Pixtral tower, Mistral3MultiModalProjector
    (RMSNorm, 2x2 PatchMerger, Linear, GELU, Linear, no biases), a Mistral LM; PixtralProcessor
    hands the image processor patch_size x spatial_merge_size (processing_pixtral.py:94)"""
    spec = _pixtral(p)
    cfg = spec["config"]
    cfg.pop("vision_feature_select_strategy")
    cfg.update(spatial_merge_size=2, multimodal_projector_bias=False)
    kw = dict(spec["processor"][1], patch_size={"height": 32, "width": 32})
    return dict(spec, config=cfg, processor=("PixtralImageProcessor", kw))


GC = {"use_reentrant": False, "every_n_layers": 1}
GC_R = {"use_reentrant": True, "every_n_layers": 1}
TOWER = {"hidden": 64, "vhidden": 128, "vlayers": 4}
BIG = dict(TOWER, longest=256)

# (mode, precision, attention, checkpointing, B, images per sample, image (H, W), model)
ROWS = [
    ("lora", "bf16", "sdpa", False, 2, 1, (128, 128), {}),
    ("lora", "bf16", "eager", False, 2, 1, (128, 128), {}),
    ("lora", "bf16", "sdpa", GC, 2, 1, (96, 160), {}),
    ("lora", "bf16", "eager", GC_R, 1, 2, (96, 160), {}),
    ("full", "bf16", "sdpa", False, 2, 1, (128, 128), {}),
    ("full", "bf16", "eager", False, 1, 2, (96, 160), {}),
    ("full", "bf16", "sdpa", GC, 2, 1, (96, 160), {}),
    ("full", "bf16", "eager", GC, 2, 1, (128, 128), {}),
    ("full", "fp32", "sdpa", False, 1, 1, (128, 128), {}),
    ("full", "fp32", "eager", GC_R, 1, 1, (96, 160), {}),
    ("finetune", "bf16", "sdpa", False, 2, 1, (112, 112), {"vlayers": 3}),
    ("frozen_llm", "bf16", "sdpa", False, 2, 1, (128, 128), {"vlayers": 3}),
    ("frozen_llm", "bf16", "eager", GC, 1, 2, (96, 160), {"vlayers": 3}),
    # the tower sets the peak: a wider, deeper tower over 4 images, a small LM; 112 px gives
    # 49 patches an image (the sequence no multiple of 16: SDPA's padded mask copies)
    ("frozen_llm", "bf16", "sdpa", False, 2, 2, (112, 112), TOWER),
    ("frozen_llm", "bf16", "eager", False, 2, 2, (128, 128), TOWER),
    ("frozen_llm", "fp32", "sdpa", False, 1, 2, (96, 160), TOWER),
    ("full", "bf16", "sdpa", GC, 2, 2, (112, 112), TOWER),
    ("full", "bf16", "eager", GC_R, 2, 2, (96, 160), TOWER),
    ("lora", "bf16", "sdpa", GC, 2, 2, (112, 112), TOWER),
    # larger images (longest_edge 256): 900 / 1024 patches in the one sequence, the tower's
    # attention and mask above the LM's logits
    ("frozen_llm", "bf16", "eager", False, 2, 2, (256, 256), BIG),
    ("full", "bf16", "sdpa", False, 2, 2, (240, 240), BIG),
    ("frozen_llm", "bf16", "sdpa", GC, 2, 2, (240, 240), BIG),
    # autocast over an fp32 model: ln_pre's weight * x gives fp32, so the mask is fp32
    ("full", "amp_bf16", "sdpa", False, 2, 2, (112, 112), TOWER),
    ("frozen_llm", "amp_bf16", "eager", False, 2, 2, (128, 128), TOWER),
]


# Mistral3 (Mistral-Small-3.1 layout): (mode, precision, attention, checkpointing, B, k, image, model)
M3_ROWS = [
    ("lora", "bf16", "sdpa", False, 2, 1, (128, 128), {}),
    ("full", "bf16", "eager", False, 2, 1, (96, 160), {}),
    ("full", "bf16", "sdpa", GC, 2, 2, (128, 128), TOWER),
    ("frozen_llm", "bf16", "sdpa", False, 2, 2, (96, 160), TOWER),
    ("frozen_llm", "bf16", "eager", GC_R, 2, 2, (128, 128), TOWER),
    ("full", "bf16", "sdpa", False, 2, 2, (240, 240), BIG),
]


def setups():
    import truth
    out = []
    for mode, prec, attn, gc_, B, k, img, model in ROWS:
        lora = None
        if mode == "lora":
            lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "language-linear",
                    "on": "language"}
        S = 576 if model.get("longest") else 192     # 4 + 2 x (256 + 16 + 2) + 16 tokens fit
        out.append(truth.make_setup("pixtral", mode, prec, attn, gc_, B, S, k, img, "adamw_torch", "single", 1,
                                    model=dict(model), lora=lora, seed=29))
    for mode, prec, attn, gc_, B, k, img, model in M3_ROWS:
        lora = None
        if mode == "lora":
            lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "language-linear",
                    "on": "language"}
        S = 576 if model.get("longest") else 192
        out.append(truth.make_setup("mistral3", mode, prec, attn, gc_, B, S, k, img, "adamw_torch", "single", 1,
                                    model=dict(model), lora=lora, seed=31))
    return out


def visual_upper_bound(img):
    """[IMG] + [IMG_BREAK] / [IMG_END] tokens of an image of at most LONGEST pixels a side
    (the BIG rows state a seq_len that holds their larger images)"""
    g = LONGEST // 16
    return g * g + g
