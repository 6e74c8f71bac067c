"""Truth rows for per-tower gradient checkpointing (issue 23): the vision tower's checkpointing
switched apart from the LLM's, as ms-swift's vit_gradient_checkpointing does it
(swift/trainers/mixin.py SwiftMixin._prepare_gradient_checkpointing: after the model-wide
gradient_checkpointing_enable(), for each model_arch.vision_tower either
`vision_tower.gradient_checkpointing_enable(**gc_kwargs); vision_tower.enable_input_require_grads()`
or `vision_tower.gradient_checkpointing_disable(); vision_tower.disable_input_require_grads()`).

Each setup carries `vit_gradient_checkpointing` (bool); truth.py apply_tower_checkpointing applies
it that way.  With the setup's gradient_checkpointing False and vit True, only the tower is
checkpointed (the model-wide call is not made).  The tower and the connector are trained, the
LLM frozen (mode frozen_llm: its gradients still flow back through the LLM to the tower), so the
AdamW states stay small and the step's peak is in forward / backward, where the switch shows.
Small on purpose: 2 shared CPU cores.

    setups()    the rows, called by ONE line of truth.py config_list
"""

GC = {"use_reentrant": False, "every_n_layers": 1}

# (family, LLM checkpointing, vit_gradient_checkpointing (None: the key stays out), B, image, model)
ROWS = [
    ("llava", False, None, 2, (224, 224), {"image": 224, "layers": 2, "vlayers": 4}),
    ("llava", GC, None, 2, (224, 224), {"image": 224, "layers": 2, "vlayers": 4}),
    ("llava", GC, False, 2, (224, 224), {"image": 224, "layers": 2, "vlayers": 4}),
    ("llava", False, True, 2, (224, 224), {"image": 224, "layers": 2, "vlayers": 4}),
    ("llava", GC, True, 2, (224, 224), {"image": 224, "layers": 2, "vlayers": 4}),
    ("qwen2_vl", GC, False, 2, (224, 224), {"layers": 2}),
    ("qwen2_vl", False, True, 2, (224, 224), {"layers": 2}),
    ("qwen2_vl", GC, True, 2, (224, 224), {"layers": 2}),
    ("internvl", GC, False, 2, (112, 112), {"layers": 2}),
    ("internvl", False, True, 2, (112, 112), {"layers": 2}),
    ("internvl", GC, True, 2, (112, 112), {"layers": 2}),
]


def setups():
    import truth
    out = []
    for fam, gc_, vit, B, img, model in ROWS:
        S = 384 if fam == "llava" else 128      # LLaVA 224 px: 256 image tokens
        out.append(truth.make_setup(fam, "frozen_llm", "bf16", "sdpa", gc_, B, S, 1, img, "adamw_torch", "single", 1,
                                    model=dict(model), seed=17, vit_gc=vit))
    return out


def all_setups():
    """the one generator truth.py config_list calls"""
    return setups() + video_setups()


def vision_tower(model):
    """ms-swift model_arch.vision_tower of these families: model.vision_tower (llava_hf,
    internvl_hf), model.visual (qwen2_vl)"""
    inner = model.model
    return getattr(inner, "visual", None) or inner.vision_tower


def apply(model, setup):
    """ms-swift _prepare_gradient_checkpointing for the rows' vision tower"""
    vit = setup.get("vit_gradient_checkpointing")
    if vit is None:
        return
    tower = vision_tower(model)
    try:                        # ms-swift: `except (NotImplementedError, AttributeError): pass`
        if vit:
            gc_ = setup["gradient_checkpointing"] or GC
            tower.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": gc_["use_reentrant"]})
            tower.enable_input_require_grads()
        else:
            tower.gradient_checkpointing_disable()
            tower.disable_input_require_grads()
    except (NotImplementedError, AttributeError):
        pass


# ---------------------------------------------------------------- Qwen-VL video (issue 23 item 3)
# (family, frames, B, image) : one video per sample through Qwen2VLVideoProcessor, the tower trained
VIDEO_ROWS = [
    ("qwen2_vl", 4, 1, (112, 112)),
    ("qwen2_vl", 5, 1, (112, 112)),     # odd: the processor repeats the last frame (temporal_patch_size 2)
    ("qwen2_vl", 8, 2, (84, 112)),
    ("qwen2_5_vl", 6, 1, (112, 112)),
]


# (family, frames, B, image, (video_min_pixels, video_max_pixels)): frames resized by their own
# bounds, not the image processor's (ms-swift's VIDEO_MIN/MAX_PIXELS through qwen_vl_utils)
VIDEO_PX_ROWS = [
    ("qwen2_vl", 4, 1, (224, 224), (3136, 12544)),      # frames scaled down to 112 x 112
    ("qwen2_vl", 6, 1, (84, 112), (20000, 40000)),      # scaled up past the image processor's
    ("qwen2_5_vl", 4, 2, (224, 168), (3136, 25088)),
]


def video_setups():
    import truth
    out = []
    for fam, frames, B, img in VIDEO_ROWS:
        s = truth.make_setup(fam, "frozen_llm", "bf16", "sdpa", False, B, 384, 1, img, "adamw_torch", "single", 1,
                             model={"layers": 2}, seed=19, video=frames)
        out.append(s)
    for fam, frames, B, img, px in VIDEO_PX_ROWS:
        out.append(truth.make_setup(fam, "frozen_llm", "bf16", "sdpa", False, B, 384, 1, img, "adamw_torch",
                                    "single", 1, model={"layers": 2}, seed=19, video=frames, video_px=px))
    return out


def video_inputs(spec, cfg, setup, B, k, seed):
    """pixel_values_videos / video_grid_thw in the layout Qwen2VLVideoProcessor makes them
    (transformers models/qwen2_vl/video_processing_qwen2_vl.py: frames padded to a multiple of
    temporal_patch_size by repeating the last, smart_resize per frame, then (t*gh*gw, C*T*P*P)
    rows in fp32), with the image processor's patch, merge and pixel bounds.  That class needs
    torchvision, which the truth venv lacks: each temporal group's rows are the image
    processor's rows of its first frame (Qwen2VLImageProcessor repeats an image over T), the
    same shape and dtype, so the same bytes; only the pixel values differ."""
    import torch
    import families
    H, W = setup["image_size"]
    F = setup["video_frames"]
    proc = families.make_processor(spec)
    T = proc.temporal_patch_size
    t = (F + T - 1) // T
    rows, thws = [], []
    for i in range(B * k):
        frames = families.synthetic_images(F, (H, W), seed + i)
        frames = frames + [frames[-1]] * (t * T - F)
        px = {k: setup[v] for k, v in (("min_pixels", "video_min_pixels"), ("max_pixels", "video_max_pixels"))
              if setup.get(v)}  # the frames' own bounds (qwen_vl_utils fetch_video resizes them so)
        outs = [dict(proc(images=[frames[j * T]], return_tensors="pt", **px)) for j in range(t)]
        g = outs[0]["image_grid_thw"][0]
        rows.append(torch.cat([o["pixel_values"] for o in outs]))
        thws.append([t, int(g[1]), int(g[2])])
    out = {"pixel_values_videos": torch.cat(rows), "video_grid_thw": torch.tensor(thws)}
    patches = [a * b * c for a, b, c in thws]
    m = cfg.vision_config.spatial_merge_size ** 2
    return out, [p // m for p in patches], patches, cfg.video_token_id
