"""Tiny-dimension configs of the real HF classes and the family's own inputs.

Every model is built from a config with random init (fixed seed), never
downloaded.  Dimensions are small so that a training step runs in seconds on
2 cores; the structural choices (GQA ratio, tied/untied embeddings, qkv bias,
vocab/hidden ratio, window and merge sizes, tile sizes, layer patterns) follow
the published configs (../shared/import/*/config.json, the HF defaults of each
configuration_*.py) scaled down.  Special token ids are moved to the top of the
(scaled) vocabulary.

Inputs are built as the family's processor builds them: the real (PIL) image
processor of transformers 5.17 turns synthetic images into pixel_values /
image_grid_thw / tiles, the number of image placeholder tokens per image is
the model's own (counted from its get_image_features), labels are -100 on the
prompt and image positions, attention_mask is all ones.
"""
import math

import numpy as np
import torch

FAMILIES = {}


def family(name, hf_class, model_type, multimodal=True):
    def deco(fn):
        FAMILIES[name] = dict(name=name, hf_class=hf_class, model_type=model_type,
                              build=fn, multimodal=multimodal)
        return fn
    return deco


def _rup(n, m):
    return (n + m - 1) // m * m


def vocab_for(h, ratio, cap=None):
    v = _rup(int(h * ratio), 64)
    return min(v, cap) if cap else v


def text_cfg(d, h, layers, heads, kv, inter, vocab, **extra):
    c = dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
             num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
             max_position_embeddings=4096)
    c.update(extra)
    d.update(c)
    return d


# ---------------------------------------------------------------- text-only
@family("llama", "LlamaForCausalLM", "llama", multimodal=False)
def _llama(p):
    h = p.get("hidden", 256)
    # Llama-2/3: GQA (8 kv of 32/64 heads), untied, no bias; vocab/hidden 7.8 (L2) .. 32 (L3)
    cfg = text_cfg({}, h, p.get("layers", 2), h // 64, max(1, h // 64 // p.get("gqa", 2)),
                   int(h * 2.6875) // 8 * 8, p.get("vocab", 32000), tie_word_embeddings=False,
                   rms_norm_eps=1e-5, head_dim=64)
    return dict(config=cfg)


@family("qwen2", "Qwen2ForCausalLM", "qwen2", multimodal=False)
def _qwen2(p):
    h = p.get("hidden", 256)
    # Qwen2.5-7B: 28 q / 4 kv heads, qkv bias, untied, vocab 152064 (ratio 42)
    cfg = text_cfg({}, h, p.get("layers", 2), h // 32, max(1, h // 32 // 7 * 1) or 1,
                   int(h * 5.29) // 8 * 8, vocab_for(h, 42.4), tie_word_embeddings=p.get("tied", False),
                   rms_norm_eps=1e-6, rope_theta=1e6)
    cfg["num_key_value_heads"] = max(1, cfg["num_attention_heads"] // 4)
    return dict(config=cfg)


@family("mixtral", "MixtralForCausalLM", "mixtral", multimodal=False)
def _mixtral(p):
    h = p.get("hidden", 128)
    # Mixtral-8x7B: 8 experts top-2, 32 q / 8 kv, untied, vocab 32000 (ratio 7.8)
    cfg = text_cfg({}, h, p.get("layers", 2), h // 32, max(1, h // 32 // 4),
                   int(h * 3.5), vocab_for(h, 7.8), tie_word_embeddings=False,
                   num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                   output_router_logits=p.get("router_logits", False), head_dim=32)
    return dict(config=cfg)


@family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe", multimodal=False)
def _qwen3_moe(p):
    h = p.get("hidden", 128)
    # Qwen3-30B-A3B: 128 experts top-8 (moe_inter 768 = 0.375 h), 32 q / 4 kv, head_dim 128,
    # QK-norm, untied, vocab 151936 (ratio 74); scaled: 16 experts top-4
    cfg = text_cfg({}, h, p.get("layers", 2), h // 32, max(1, h // 32 // 8) if h >= 256 else 1,
                   int(h * 3), vocab_for(h, 74.2, 12288), tie_word_embeddings=False,
                   num_experts=16, num_experts_per_tok=4, moe_intermediate_size=max(16, int(h * 0.375) // 8 * 8),
                   decoder_sparse_step=1, head_dim=32, norm_topk_prob=True,
                   output_router_logits=p.get("router_logits", False))
    return dict(config=cfg)


# ---------------------------------------------------------------- multimodal
def _top_ids(vocab, n):
    """n special ids at the top of the vocabulary (as the real configs place them)."""
    return [vocab - n + i for i in range(n)]


@family("llava", "LlavaForConditionalGeneration", "llava")
def _llava(p):
    h = p.get("hidden", 256)
    vocab = vocab_for(h, 7.83)          # 32064 / 4096
    img_tok, pad_tok = _top_ids(vocab, 2)
    vs = p.get("image", 112)
    cfg = dict(
        image_token_index=img_tok, pad_token_id=pad_tok, projector_hidden_act="gelu",
        vision_feature_layer=-2, vision_feature_select_strategy="default", tie_word_embeddings=False,
        image_seq_length=(vs // 14) ** 2,
        vision_config=dict(model_type="clip_vision_model", hidden_size=p.get("vhidden", 128),
                           intermediate_size=p.get("vhidden", 128) * 4, num_hidden_layers=p.get("vlayers", 3),
                           num_attention_heads=p.get("vhidden", 128) // 64, image_size=vs, patch_size=14,
                           hidden_act="quick_gelu", projection_dim=96),
        text_config=text_cfg(dict(model_type="llama"), h, p.get("layers", 2), h // 64, h // 64,
                             int(h * 2.6875) // 8 * 8, vocab, tie_word_embeddings=False, rms_norm_eps=1e-5,
                             head_dim=64),
    )
    proc = ("CLIPImageProcessor", dict(size={"shortest_edge": vs}, crop_size={"height": vs, "width": vs},
                                       do_center_crop=True, resample=3,
                                       image_mean=[0.48145466, 0.4578275, 0.40821073],
                                       image_std=[0.26862954, 0.26130258, 0.27577711]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="plain")


@family("llava_onevision", "LlavaOnevisionForConditionalGeneration", "llava_onevision")
def _llava_ov(p):
    h = p.get("hidden", 128)
    vocab = vocab_for(h, 42.4)          # Qwen2 7B: 152064 / 3584
    img_tok, vid_tok = _top_ids(vocab, 2)
    vs = p.get("tile", 56)              # SigLIP 384/14 -> tiny 56/14 = 4x4 patches per tile
    pin = [[vs * a, vs * b] for a in range(1, 4) for b in range(1, 4)]
    cfg = dict(
        image_token_index=img_tok, video_token_index=vid_tok, projector_hidden_act="gelu",
        vision_feature_layer=-1, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=pin, tie_word_embeddings=False,
        vision_config=dict(model_type="siglip_vision_model", hidden_size=p.get("vhidden", 96),
                           intermediate_size=int(p.get("vhidden", 96) * 3.74) // 8 * 8,
                           num_hidden_layers=p.get("vlayers", 2), num_attention_heads=p.get("vhidden", 96) // 32,
                           image_size=vs, patch_size=14, hidden_act="gelu_pytorch_tanh"),
        text_config=text_cfg(dict(model_type="qwen2"), h, p.get("layers", 2), h // 32, max(1, h // 32 // 7) or 1,
                             int(h * 5.29) // 8 * 8, vocab, tie_word_embeddings=False, rms_norm_eps=1e-6),
    )
    cfg["text_config"]["num_key_value_heads"] = max(1, cfg["text_config"]["num_attention_heads"] // 4)
    proc = ("LlavaOnevisionImageProcessor", dict(size={"height": vs, "width": vs}, image_grid_pinpoints=pin,
                                                 do_pad=True,
                                                 image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="plain", image_sizes=True)


def _qwen_vl_common(p, kind):
    h = p.get("hidden", 128)
    vocab = vocab_for(h, 42.4)
    ids = _top_ids(vocab, 5)
    vstart, vend, vpad, img_tok, vid_tok = ids
    heads = h // 32
    text = text_cfg(dict(), h, p.get("layers", 2), heads, max(1, heads // 4) if heads >= 4 else 1,
                    int(h * 5.29) // 8 * 8, vocab, tie_word_embeddings=False, rms_norm_eps=1e-6,
                    rope_theta=1e6)
    cfg = dict(image_token_id=img_tok, video_token_id=vid_tok, vision_start_token_id=vstart,
               vision_end_token_id=vend, tie_word_embeddings=False)
    vh = p.get("vhidden", 64)
    if kind == "qwen2_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [4, 6, 6]}
        text["model_type"] = "qwen2_vl_text"
        cfg["vision_config"] = dict(depth=p.get("vlayers", 2), embed_dim=vh, hidden_size=h, hidden_act="quick_gelu",
                                    mlp_ratio=4, num_heads=vh // 16 if vh >= 64 else 2, patch_size=14,
                                    spatial_merge_size=2, temporal_patch_size=2)
        patch = 14
    elif kind == "qwen2_5_vl":
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [4, 6, 6]}
        text["model_type"] = "qwen2_5_vl_text"
        depth = p.get("vlayers", 4)
        cfg["vision_config"] = dict(depth=depth, hidden_size=vh, out_hidden_size=h, hidden_act="silu",
                                    intermediate_size=int(vh * 2.67) // 8 * 8, num_heads=vh // 16 if vh >= 64 else 2,
                                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                                    fullatt_block_indexes=[i for i in range(depth) if i % 2 == 1])
        patch = 14
    else:  # qwen3_vl / qwen3_vl_moe
        text.update(head_dim=32, rope_scaling={"rope_type": "default", "mrope_section": [4, 6, 6],
                                               "mrope_interleaved": True})
        text["rope_theta"] = 5e6
        depth = p.get("vlayers", 3)
        cfg["vision_config"] = dict(depth=depth, hidden_size=vh, out_hidden_size=h, hidden_act="gelu_pytorch_tanh",
                                    intermediate_size=int(vh * 3.74) // 8 * 8, num_heads=vh // 16 if vh >= 64 else 2,
                                    patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                                    num_position_embeddings=64, deepstack_visual_indexes=list(range(depth - 2, depth)))
        patch = 16
        if kind == "qwen3_vl_moe":
            text.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=max(16, int(h * 0.375) // 8 * 8),
                        decoder_sparse_step=1, tie_word_embeddings=False, norm_topk_prob=True)
    cfg["text_config"] = text
    proc = ("Qwen2VLImageProcessor", dict(min_pixels=(patch * 2) ** 2 * 4, max_pixels=(patch * 2) ** 2 * 400,
                                          patch_size=patch, temporal_patch_size=2, merge_size=2,
                                          image_mean=[0.48145466, 0.4578275, 0.40821073],
                                          image_std=[0.26862954, 0.26130258, 0.27577711]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="qwen", wrap=(vstart, vend),
                mm_token_type_ids=True)


for _name, _cls in (("qwen2_vl", "Qwen2VLForConditionalGeneration"),
                   ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
                   ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
                   ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration")):
    family(_name, _cls, _name)(lambda p, _k=_name: _qwen_vl_common(p, _k))


@family("internvl", "InternVLForConditionalGeneration", "internvl")
def _internvl(p):
    h = p.get("hidden", 128)
    vocab = vocab_for(h, 42.4)
    img_tok, start_tok, end_tok = _top_ids(vocab, 3)
    vs = p.get("tile", 112)             # InternViT 448/14 -> tiny 112/14 = 8x8 -> 16 tokens after pixel shuffle
    vh = p.get("vhidden", 96)
    cfg = dict(image_token_id=img_tok, image_seq_length=(vs // 14) ** 2 // 4, downsample_ratio=0.5,
               projector_hidden_act="gelu", vision_feature_layer=-1, vision_feature_select_strategy="default",
               tie_word_embeddings=False,
               vision_config=dict(hidden_size=vh, num_hidden_layers=p.get("vlayers", 2), num_attention_heads=vh // 32,
                                  intermediate_size=vh * 4, hidden_act="gelu", image_size=[vs, vs],
                                  patch_size=[14, 14], attention_bias=True, use_qk_norm=False,
                                  layer_scale_init_value=0.1, use_mean_pooling=True, norm_type="layer_norm"),
               text_config=text_cfg(dict(model_type="qwen2"), h, p.get("layers", 2), h // 32, 1,
                                    int(h * 5.29) // 8 * 8, vocab, tie_word_embeddings=False, rms_norm_eps=1e-6))
    cfg["text_config"]["num_key_value_heads"] = max(1, cfg["text_config"]["num_attention_heads"] // 4)
    proc = ("GotOcr2ImageProcessor", dict(size={"height": vs, "width": vs}, crop_to_patches=True,
                                          min_patches=1, max_patches=p.get("max_patches", 6),
                                          image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="wrapped", wrap=(start_tok, end_tok))


@family("gemma3", "Gemma3ForConditionalGeneration", "gemma3")
def _gemma3(p):
    h = p.get("hidden", 64)
    vocab = vocab_for(h, 113.8)         # 262208 / 2304
    boi, eoi, img_tok = _top_ids(vocab, 3)
    vs = p.get("image", 64)             # SigLIP 896/14 (64x64 patches, pooled to 16x16=256) -> 64/8 = 8x8 -> pooled 4x4
    nl = p.get("layers", 6)
    vh = p.get("vhidden", 64)
    cfg = dict(mm_tokens_per_image=16, boi_token_index=boi, eoi_token_index=eoi, image_token_index=img_tok,
               tie_word_embeddings=True,
               vision_config=dict(model_type="siglip_vision_model", hidden_size=vh, intermediate_size=int(vh * 3.74) // 8 * 8,
                                  num_hidden_layers=p.get("vlayers", 2), num_attention_heads=vh // 32,
                                  image_size=vs, patch_size=8, hidden_act="gelu_pytorch_tanh",
                                  vision_use_head=False),
               text_config=text_cfg(dict(model_type="gemma3_text"), h, nl, 2, 1, h * 4, vocab,
                                    head_dim=32, query_pre_attn_scalar=32, sliding_window=p.get("window", 64),
                                    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                                 for i in range(nl)],
                                    rope_theta=1e6, rope_local_base_freq=1e4, final_logit_softcapping=None,
                                    attn_logit_softcapping=None, tie_word_embeddings=True))
    proc = ("Gemma3ImageProcessor", dict(size={"height": vs, "width": vs}, do_pan_and_scan=False,
                                         image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="wrapped", wrap=(boi, eoi),
                token_type_ids=True)


@family("mllama", "MllamaForConditionalGeneration", "mllama")
def _mllama(p):
    h = p.get("hidden", 128)
    vocab = vocab_for(h, 31.3)          # 128264 / 4096
    img_tok = vocab - 8
    vs = p.get("tile", 56)              # 560/14 -> tiny 56/14 = 4x4 patches (+CLS) per tile
    nl = p.get("layers", 5)
    vh = p.get("vhidden", 64)
    cfg = dict(image_token_index=img_tok,
               vision_config=dict(hidden_size=vh, num_hidden_layers=p.get("vlayers", 4), num_global_layers=2,
                                  num_attention_heads=vh // 32, intermediate_size=vh * 4, image_size=vs,
                                  patch_size=14, max_num_tiles=4, intermediate_layers_indices=[0, 2],
                                  vision_output_dim=vh * 3, hidden_act="gelu",
                                  supported_aspect_ratios=[[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]),
               text_config=text_cfg(dict(), h, nl, h // 32, max(1, h // 32 // 4), int(h * 3.5), vocab,
                                    cross_attention_layers=[3], tie_word_embeddings=False, rope_theta=5e5,
                                    pad_token_id=vocab - 4,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
    proc = ("MllamaImageProcessor", dict(size={"height": vs, "width": vs}, max_image_tiles=4,
                                         image_mean=[0.48145466, 0.4578275, 0.40821073],
                                         image_std=[0.26862954, 0.26130258, 0.27577711]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="mllama")


def _idefics_common(p, smol):
    h = p.get("hidden", 128)
    if smol:
        vocab = vocab_for(h, 84.4)      # SmolVLM2-256M/2.2B: 49280 / 576..2048; tied
    else:
        vocab = vocab_for(h, 31.3)      # Idefics3-8B (Llama-3.1): 128259 / 4096
    img_tok, fake_tok = _top_ids(vocab, 2)
    vs = p.get("tile", 64)              # SigLIP 364 (patch 14) / 512 (patch 16) -> tiny 64/16 = 4x4 per tile
    vh = p.get("vhidden", 64)
    cfg = dict(image_token_id=img_tok, scale_factor=2 if not smol else 2, tie_word_embeddings=smol,
               vision_config=dict(hidden_size=vh, intermediate_size=int(vh * 3.74) // 8 * 8,
                                  num_hidden_layers=p.get("vlayers", 2), num_attention_heads=vh // 32,
                                  image_size=vs, patch_size=16, hidden_act="gelu_pytorch_tanh"),
               text_config=text_cfg(dict(model_type="llama"), h, p.get("layers", 2), h // 32,
                                    max(1, h // 32 // (3 if smol else 4)), int(h * 3.5), vocab,
                                    tie_word_embeddings=smol, head_dim=32, rope_theta=1e5 if smol else 5e5))
    proc = ("SmolVLMImageProcessor" if smol else "Idefics3ImageProcessor",
            dict(size={"longest_edge": vs * 2}, max_image_size={"longest_edge": vs}, do_image_splitting=True,
                 image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]))
    return dict(config=cfg, processor=proc, image_token=img_tok, layout="plain_pos")


@family("idefics3", "Idefics3ForConditionalGeneration", "idefics3")
def _idefics3(p):
    return _idefics_common(p, smol=False)


@family("smolvlm", "SmolVLMForConditionalGeneration", "smolvlm")
def _smolvlm(p):
    return _idefics_common(p, smol=True)


# ---------------------------------------------------------------- build
def make_config(fam, p):
    import transformers
    spec = FAMILIES[fam]["build"](p)
    cfg = transformers.AutoConfig.for_model(FAMILIES[fam]["model_type"], **spec["config"])
    return cfg, spec


def make_processor(spec):
    import transformers
    if not spec.get("processor"):
        return None
    import importlib
    name, kw = spec["processor"]
    # the PIL backend class, from its own module: transformers' lazy top-level export of the
    # Idefics3/SmolVLM PIL processors wrongly demands torchvision (the module itself does not)
    mod = {"Idefics3ImageProcessor": "idefics3", "SmolVLMImageProcessor": "smolvlm"}.get(name)
    if mod:
        m = importlib.import_module("transformers.models.%s.image_processing_pil_%s" % (mod, mod))
        return getattr(m, name + "Pil")(**kw)
    cls = getattr(transformers, name + "Pil", None) or getattr(transformers, name)
    return cls(**kw)


def synthetic_images(n, size, seed):
    from PIL import Image
    rng = np.random.default_rng(seed)
    H, W = size
    return [Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)) for _ in range(n)]


import pixtral as _pixtral  # noqa: E402,F401  registers "pixtral" (tests/truth/pixtral.py)
