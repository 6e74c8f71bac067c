"""CUDA-kernel emulations: make the counted CPU bytes those of the CUDA kernel.

Each emulation computes its numerics with the real CPU op (inside
memhook.uncounted(), so the CPU kernel's own scratch is not counted) and
allocates, counted, exactly the tensors the CUDA kernel allocates in device
memory, with the same dtype, shape and strides, alive for the same time.  The
evidence (CUDA source file and statement) for each is in docs/oracle.md; the
numerics and byte checks are in selftest.py.

    install(names)   patch the emulations listed (default: ALL)
"""
import math

import torch
import torch.nn.functional as F

import memhook

ALL = ("sdpa_cuda", "layer_norm_cuda", "dropout_cuda", "autocast_cuda", "grouped_mm_cuda", "embedding_backward_cuda",
       "conv_cudnn", "rng_state_host", "adamw_step_host", "adamw_foreach", "device_batch_copy", "nccl_collectives",
       "softmax_backward_cuda")
_orig = {}
_REAL_SDPA = F.scaled_dot_product_attention
_REAL_LN = F.layer_norm
_REAL_DROPOUT = F.dropout
_orig_conv2d = F.conv2d
active = []


def _rup(n, m):
    return (n + m - 1) // m * m


# --------------------------------------------------------------- SDPA
def sdpa_backend(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
    """The backend CUDA's select_sdp_backend picks (default priority order
    flash > efficient > math; cuDNN last, i.e. TORCH_CUDNN_SDPA_DEPRIORITIZED or
    cuDNN <= 9.15 — see docs/oracle.md)."""
    D = q.shape[-1]
    same_d = k.shape[-1] == D and v.shape[-1] == D
    L, S = q.shape[-2], k.shape[-2]
    H, Hk, Hv = q.shape[-3], k.shape[-3], v.shape[-3]
    low = q.dtype in (torch.float16, torch.bfloat16)
    gqa = Hk != H or Hv != H
    if gqa and not enable_gqa:
        return "error"
    flash = (low and attn_mask is None and same_d and D % 8 == 0 and D <= 256
             and not (is_causal and L != S) and Hk == Hv)
    if flash:
        return "flash"
    align = 8 if low else 4
    eff = (not gqa) and D % align == 0 and v.shape[-1] % align == 0 and k.shape[-1] == D
    if eff:
        return "efficient"
    return "math"


class _FusedSDPA(torch.autograd.Function):
    """Counted: what the CUDA flash / mem-efficient kernels allocate."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, kind):
        B, H, L, D = q.shape
        with memhook.uncounted():
            o = _REAL_SDPA(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=is_causal,
                                               scale=scale, enable_gqa=enable_gqa)
        if kind == "flash":
            # flash_api.cpp mha_fwd: out = empty_like(q_padded) on the (B,L,H,D) view of q,
            # softmax_lse (B,H,L) fp32, rng_state uint64[2], _unused uint64[]
            out = torch.empty_like(q.transpose(1, 2)).transpose(1, 2)
            lse = torch.empty((B, H, L), dtype=torch.float32)
            rng = torch.empty((2,), dtype=torch.int64)
            unused = torch.empty((), dtype=torch.int64)
            extra = (rng, unused)
        else:
            # attention.cu _efficient_attention_forward: res (B,M,H,Kv), logsumexp (B,H,M^32) fp32;
            # seed/offset are host tensors without dropout
            out = torch.empty((B, L, H, v.shape[-1]), dtype=q.dtype).transpose(1, 2)
            lse = torch.empty((B, H, _rup(L, 32)), dtype=torch.float32)
            extra = ()
        with memhook.uncounted():
            out.copy_(o)
            del o
        ctx.save_for_backward(q, k, v, out, lse, mask, *extra)
        ctx.cfg = (dropout_p, is_causal, scale, enable_gqa, kind)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, mask = ctx.saved_tensors[:6]
        dropout_p, is_causal, scale, enable_gqa, kind = ctx.cfg
        B, H, L, D = q.shape
        Hk, S = k.shape[-3], k.shape[-2]
        dq = torch.empty_like(q)
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
        bufs = []
        if kind == "flash":
            # flash_api.cpp mha_bwd: softmax_d (B,H,L^128) fp32, dq_accum (B,L^128,H,D^32) fp32,
            # GQA: dk_expanded/dv_expanded (B,S,H,D) in q's dtype, summed into dk/dv
            bufs.append(torch.empty((B, H, _rup(L, 128)), dtype=torch.float32))
            bufs.append(torch.empty((B, _rup(L, 128), H, _rup(D, 32 if D <= 128 else 64)), dtype=torch.float32))
            if Hk != H:
                bufs.append(torch.empty((B, S, H, D), dtype=q.dtype))
                bufs.append(torch.empty((B, S, H, D), dtype=q.dtype))
        else:
            # attention_backward.cu _efficient_attention_backward: delta (B,H,M) fp32; 16-bit
            # outputs accumulate grad_q in an fp32 workspace (B,M,H,K)
            bufs.append(torch.empty((B, H, L), dtype=torch.float32))
            if q.dtype != torch.float32:
                bufs.append(torch.empty((B, L, H, D), dtype=torch.float32))
        with memhook.uncounted(), torch.enable_grad():
            qq = q.detach().requires_grad_()
            kk = k.detach().requires_grad_()
            vv = v.detach().requires_grad_()
            o = _REAL_SDPA(qq, kk, vv, attn_mask=mask, dropout_p=0.0, is_causal=is_causal,
                                               scale=scale, enable_gqa=enable_gqa)
            gq, gk, gv = torch.autograd.grad(o, (qq, kk, vv), dout)
            dq.copy_(gq)
            dk.copy_(gk)
            dv.copy_(gv)
            del o, gq, gk, gv, qq, kk, vv
        del bufs
        return dq, dk, dv, None, None, None, None, None, None


def _autocast_on():
    return torch.is_autocast_enabled("cpu")


def sdpa_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if _autocast_on():
        # both autocast lists put scaled_dot_product_attention in lower precision: every floating
        # argument (mask included) is cast, then the kernel runs with autocast excluded
        dt = torch.get_autocast_dtype("cpu")
        c = lambda t: t.to(dt) if t is not None and t.is_floating_point() and t.dtype != dt else t
        query, key, value, attn_mask = c(query), c(key), c(value), c(attn_mask)
        with torch.autocast("cpu", enabled=False):
            return sdpa_cuda(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    kind = sdpa_backend(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # attention.cpp scaled_dot_product_attention: convert_boolean_attn_mask for every
        # non-cuDNN backend: where(mask.logical_not(), -inf, scalar_tensor(0, q.dtype))
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"),
                                torch.scalar_tensor(0.0, dtype=query.dtype))
    if kind == "efficient" and attn_mask is not None and attn_mask.shape[-1] % 16:
        # attention.cpp preprocess_mask -> pad_bias: the bias' last dim padded to a multiple of 16
        # (a padded copy), sliced back, then expanded
        S = attn_mask.shape[-1]
        attn_mask = F.pad(attn_mask, (0, 16 - S % 16))[..., :S]
    if kind == "math" or kind == "error":
        # the math backend is a CompositeImplicit decomposition: the same ops, the same bytes
        # on CPU and CUDA (incl. its fp32 upcast of 16-bit inputs).  dropout > 0 does not change
        # the choice: flash and mem-efficient take dropout on CUDA (sdp_utils.cpp has no dropout
        # constraint for them); they regenerate the mask from the Philox state in backward and
        # store none (flash: the rng_state counted below; efficient: seed/offset are host scalars
        # outside CUDA graph capture).  The numerics here are those of dropout 0 (same bytes).
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]
    return _FusedSDPA.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kind)


# --------------------------------------------------------------- LayerNorm
class _LayerNormCuda(torch.autograd.Function):
    """CUDA native_layer_norm keeps mean/rstd in fp32 (acc type) for 16-bit input;
    the CPU kernel keeps them in the input dtype."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        with memhook.uncounted():
            o, _, _ = torch.ops.aten.native_layer_norm(x, normalized_shape, weight, bias, eps)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        M = x.numel() // math.prod(normalized_shape)
        stat_shape = tuple(x.shape[: x.dim() - len(normalized_shape)]) + (1,) * len(normalized_shape)
        acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        mean = torch.empty(stat_shape, dtype=acc)
        rstd = torch.empty(stat_shape, dtype=acc)
        with memhook.uncounted():
            out.copy_(o)
            del o
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.cfg = (normalized_shape, eps, M)
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        normalized_shape, eps, M = ctx.cfg
        need = ctx.needs_input_grad
        dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need[0] else None
        dw = torch.empty_like(weight) if (weight is not None and need[2]) else None
        db = torch.empty_like(bias) if (bias is not None and need[3]) else None
        with memhook.uncounted():
            _, m, r = torch.ops.aten.native_layer_norm(x, normalized_shape, weight, bias, eps)
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
                g, x, normalized_shape, m, r, weight, bias,
                [need[0], dw is not None, db is not None])
            if dx is not None:
                dx.copy_(gx)
            if dw is not None:
                dw.copy_(gw)
            if db is not None:
                db.copy_(gb)
            del gx, gw, gb, m, r
        return dx, None, dw, db, None


def layer_norm_cuda(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if _autocast_on():
        # CUDA autocast: layer_norm is fp32 (cast 16-bit args), output fp32
        c = lambda t: t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t
        with torch.autocast("cpu", enabled=False):
            return layer_norm_cuda(c(input), normalized_shape, c(weight), c(bias), eps)
    if not torch.is_grad_enabled() or not (input.requires_grad or (weight is not None and weight.requires_grad)
                                           or (bias is not None and bias.requires_grad)):
        return _REAL_LN(input, normalized_shape, weight, bias, eps)
    return _LayerNormCuda.apply(input, tuple(normalized_shape), weight, bias, eps)


# --------------------------------------------------------------- dropout
class _NativeDropoutCuda(torch.autograd.Function):
    """CUDA native_dropout (Dropout.cu dropout_cuda): `ret = at::empty_like(self)` and
    `mask = at::empty_like(self, kBool)`, nothing else; native_dropout_backward (masked_scale_cuda):
    one `at::empty_like(self)`.  The CPU kernels allocate a dtype-sized noise tensor (forward) and
    an intermediate product (backward) besides: computed uncounted, copied into the counted tensors."""

    @staticmethod
    def forward(ctx, x, p):
        out = torch.empty_like(x)
        mask = torch.empty_like(x, dtype=torch.bool)
        with memhook.uncounted():
            o, m = torch.native_dropout(x, p, True)
            out.copy_(o)
            mask.copy_(m)
            del o, m
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return out

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        gx = torch.empty_like(g)
        with memhook.uncounted():
            gx.copy_(torch.ops.aten.native_dropout_backward(g, mask, ctx.scale))
        return gx, None


def dropout_cuda(input, p=0.5, training=True, inplace=False):
    """ATen dropout takes the fused native_dropout (bool mask saved) only for CUDA/XPU
    inputs (Dropout.cpp is_fused_kernel_acceptable); on CPU it saves a dtype-sized
    noise tensor.  Counted here: what CUDA's native_dropout allocates."""
    if not training or p == 0.0 or inplace or input.numel() == 0 or p >= 1.0:
        return _REAL_DROPOUT(input, p, training, inplace)
    return _NativeDropoutCuda.apply(input, p)


# --------------------------------------------------------------- AdamW steps
def hostify_adam_steps(optimizer):
    """Non-fused, non-capturable torch AdamW keeps `step` as a 0-dim CPU tensor even on
    a GPU job (adam.py _init_group: torch.tensor(0.0, dtype=_get_scalar_dtype())): host
    memory.  Re-allocate them uncounted.  Fused AdamW keeps them on the device."""
    for g in optimizer.param_groups:
        if g.get("fused") or g.get("capturable"):
            continue
        for p in g["params"]:
            st = optimizer.state.get(p)
            if st and "step" in st and torch.is_tensor(st["step"]):
                with memhook.uncounted():
                    st["step"] = st["step"].clone()


# --------------------------------------------------------------- grouped_mm
_CPU_LIB = []


def _grouped_mm_cpu(a, b, offs=None, bias=None, out_dtype=None):
    """The CPU _grouped_mm kernel allocates per-group temporaries; the CUDA kernel allocates the
    output only (GroupedBlas create_grouped_gemm_output_tensor).  Output counted, math uncounted."""
    dt = out_dtype or a.dtype
    if a.dim() == 2 and b.dim() == 3:          # ragged M: (M,K) x (G,K,N) -> (M,N)
        out = torch.empty((a.shape[0], b.shape[-1]), dtype=dt)
        with memhook.uncounted():
            start = 0
            for g, end in enumerate(offs.tolist()):
                if end > start:
                    out[start:end].copy_(torch.mm(a[start:end], b[g]))
                start = end
            if end < a.shape[0]:
                out[end:].zero_()
    elif a.dim() == 2 and b.dim() == 2:        # ragged K: (M,K) x (K,N) -> (G,M,N)
        G = offs.numel()
        out = torch.empty((G, a.shape[0], b.shape[1]), dtype=dt)
        with memhook.uncounted():
            start = 0
            for g, end in enumerate(offs.tolist()):
                if end > start:
                    out[g].copy_(torch.mm(a[:, start:end], b[start:end]))
                else:
                    out[g].zero_()
                start = end
    elif a.dim() == 3 and b.dim() == 3:        # batched
        out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=dt)
        with memhook.uncounted():
            out.copy_(torch.bmm(a, b))
    elif a.dim() == 3 and b.dim() == 2:        # ragged N: (G,M,K) x (K,N) -> (M,N) per group columns
        out = torch.empty((a.shape[1], b.shape[1]), dtype=dt)
        with memhook.uncounted():
            start = 0
            for g, end in enumerate(offs.tolist()):
                if end > start:
                    out[:, start:end].copy_(torch.mm(a[g], b[:, start:end]))
                start = end
    else:
        raise NotImplementedError("grouped_mm shapes %s %s" % (tuple(a.shape), tuple(b.shape)))
    if bias is not None:
        with memhook.uncounted():
            out.add_(bias)
    return out


def _override_cpu_kernel(opname, fn):
    """Replace the CPU kernel of aten::opname by fn (kept alive in _CPU_LIB)."""
    if opname in _orig:
        return
    import warnings
    lib = torch.library.Library("aten", "IMPL")
    _CPU_LIB.append(lib)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl(opname, fn, "CPU")
    _orig[opname] = True


# --------------------------------------------------------------- embedding backward
NROWS_PER_THREAD = 10      # EmbeddingBackwardKernel.cu


def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """CUDA embedding_dense_backward_cuda: <= 3072 indices and no scale_grad_by_freq -> a direct
    kernel, grad_weight only; otherwise sort + segment buffers (int64 per index) and an fp32
    (acc type) per-partial-segment buffer (EmbeddingBackwardKernel.cu two-pass path)."""
    n = indices.numel()
    H = grad.shape[-1]
    scratch = []
    if n > 3072 or scale_grad_by_freq:
        it = indices.dtype
        scratch += [torch.empty(n, dtype=it), torch.empty(n, dtype=it)]          # sorted_indices, orig_indices
        scratch += [torch.empty(n, dtype=it), torch.empty((), dtype=torch.int64)]  # segment_offsets, num_of_segments
        max_seg = min(n, num_weights)
        scratch += [torch.empty(max_seg, dtype=it), torch.empty(max_seg, dtype=it),
                    torch.empty((), dtype=torch.int64)]
        max_part = n // NROWS_PER_THREAD + max_seg
        scratch += [torch.empty(max_part, dtype=it)]
        if scale_grad_by_freq:
            scratch.append(torch.empty(n, dtype=it))
    gw = torch.zeros((num_weights, H), dtype=grad.dtype)
    if scratch:
        acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
        scratch.append(torch.empty((n // NROWS_PER_THREAD + min(n, num_weights), H), dtype=acc))
    with memhook.uncounted():
        idx = indices.reshape(-1)
        g2 = grad.reshape(-1, H)
        if padding_idx >= 0:
            keep = idx != padding_idx
            idx, g2 = idx[keep], g2[keep]
        if scale_grad_by_freq:
            cnt = torch.bincount(idx, minlength=num_weights).to(g2.dtype)
            g2 = g2 / cnt[idx].unsqueeze(1)
        gw.index_add_(0, idx, g2)
    del scratch
    return gw


# --------------------------------------------------------------- softmax backward
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    """CUDA softmax_backward_cuda_out (SoftMax.cu): the structured op allocates grad_input
    (grad's options, Half when half_to_float), then `Tensor tmp = grad * output;` (grad's
    dtype) is alive while host_softmax_backward runs.  The CPU kernel allocates grad_input
    only.  Numerics: gI = output * (grad - sum(grad * output, dim)), in fp32."""
    half_to_float = grad_output.dtype != input_dtype
    gi = torch.empty(grad_output.shape, dtype=torch.float16 if half_to_float else grad_output.dtype)
    tmp = grad_output * output
    with memhook.uncounted():
        t32 = tmp.float()
        r = output.float() * (grad_output.float() - t32.sum(dim, keepdim=True))
        gi.copy_(r)
        del t32, r
    del tmp
    return gi


# --------------------------------------------------------------- convolution
class _ConvCudnn(torch.autograd.Function):
    """cuDNN convolution: output (and in backward grad_input/grad_weight/grad_bias) counted, with
    or without grad, for int and "valid"/"same" padding (conv*.padding is CompositeImplicit:
    Convolution.cpp _convolution_mode turns "valid" into padding 0, so CUDA autocast casts it
    through `convolution`, which its lower-precision list has, while the AutocastCPU conv*.padding
    kernel has no CUDA counterpart and ran it in fp32 here before);
    the CPU kernels' im2col columns / reorder scratch is not (cuDNN's workspace, which the caching
    allocator does count on a GPU, is chosen by cuDNN heuristics at run time and is not modelled)."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups):
        with memhook.uncounted():
            o = torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
        out = torch.empty(o.shape, dtype=o.dtype)
        with memhook.uncounted():
            out.copy_(o)
            del o
        ctx.save_for_backward(x, w)
        ctx.cfg = (b is not None, stride, padding, dilation, groups)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        has_b, stride, padding, dilation, groups = ctx.cfg
        need = ctx.needs_input_grad
        gx = torch.empty_like(x) if need[0] else None
        gw = torch.empty_like(w) if need[1] else None
        gb = torch.empty((w.shape[0],), dtype=w.dtype) if (has_b and need[2]) else None
        with memhook.uncounted():
            rx, rw, rb = torch.ops.aten.convolution_backward(
                g, x, w, [w.shape[0]] if has_b else None, stride, padding, dilation, False, [0] * len(stride),
                groups, [gx is not None, gw is not None, gb is not None])
            for dst, src in ((gx, rx), (gw, rw), (gb, rb)):
                if dst is not None:
                    dst.copy_(src)
            del rx, rw, rb
        return gx, gw, gb, None, None, None, None


def _str_padding(padding, weight, dilation, nd):
    """ConvUtils / Convolution.cpp _convolution_mode: "valid" is padding 0; "same" is symmetric
    padding dilation*(k-1)/2 when every total is even (otherwise the input is padded first: left
    to the real op, a string)."""
    if padding == "valid":
        return 0
    if padding == "same":
        d = list(dilation) if isinstance(dilation, (tuple, list)) else [dilation] * nd
        tot = [d[i] * (weight.shape[2 + i] - 1) for i in range(nd)]
        if all(t % 2 == 0 for t in tot):
            return [t // 2 for t in tot]
    return padding


def _conv_patch(nd):
    real = getattr(F, "conv%dd" % nd)

    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str):
            padding = _str_padding(padding, weight, dilation, nd)
        if isinstance(padding, str):       # "same" with odd totals: the real op pads the input first
            return real(input, weight, bias, stride, padding, dilation, groups)
        # with and without grad (a frozen vision tower): cuDNN allocates the output, the CPU
        # kernel im2col columns / reorders besides
        tup = lambda v: list(v) if isinstance(v, (tuple, list)) else [v] * nd
        if _autocast_on():
            dt = torch.get_autocast_dtype("cpu")
            c = lambda t: t.to(dt) if t is not None and t.is_floating_point() and t.dtype != dt else t
            input, weight, bias = c(input), c(weight), c(bias)
            with torch.autocast("cpu", enabled=False):
                return _ConvCudnn.apply(input, weight, bias, tup(stride), tup(padding), tup(dilation), groups)
        return _ConvCudnn.apply(input, weight, bias, tup(stride), tup(padding), tup(dilation), groups)
    return conv


# --------------------------------------------------------------- RNG state
_REAL_GET_RNG = torch.get_rng_state


def get_rng_state_host():
    """checkpoint stashes the CPU generator state (torch.get_rng_state: a 5 KB CPU tensor per
    checkpointed call): host memory on a GPU job."""
    with memhook.uncounted():
        return _REAL_GET_RNG()


# --------------------------------------------------------------- collectives
# gloo (the CPU backend the harness runs on) allocates ATen CPU tensors that a GPU job on NCCL
# does not allocate through the caching allocator.  Both are left out of the count:
#  * on the caller's thread, ProcessGroupGloo::reduce_scatter_tensor_coalesced (which
#    reduce_scatter_single / reduce_scatter_tensor / _reduce_scatter_base reach through
#    ProcessGroupGloo::_reduce_scatter_base) clones every input,
#    `buffers.push_back(inputTensors[i].clone());`, allreduces the clones and copies each rank's
#    chunk into the output in a LambdaWork that holds the clones until it is released
#    (pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp l.1540, in a recent main
#    that has ProcessGroupGlooDetail.hpp as torch 2.13 does; the wheel ships no .cpp, so match
#    the quoted statement);
#    and ProcessGroupGloo::enqueue (l.790-801) records every work in the flight recorder with
#    `work->getOutputTensors()`, which for AsyncAllgatherWork is `return {newLikeFlat(outputs[0])};`
#    (l.1412): a full-size transient on the caller's thread per all-gather;
#    memhook marks the allocations inside the c10d reduce-scatter / all-gather ops GLOO_CALL
#    (a RecordFunction callback on the op names);
#  * on gloo's work threads (ProcessGroupGloo::runLoop), AsyncAllgatherWork::allgather allocates
#    one flat output for the whole gather, `at::Tensor flatOutputTensor = newLikeFlat(outputs[0]);`,
#    and copies it into the outputs (same file, l.1395, AsyncAllgatherWork::allgather, run by
#    AsyncWork::execute on a work thread, l.197-204); all_gather_single /
#    all_gather_into_tensor / _all_gather_base reach it through ProcessGroupGloo::_allgather_base
#    (`at::chunk(output_tensor, ...)` then `allgather(...)`), and so does FSDP1's CPU-only
#    branch (fsdp/_flat_param.py `if sharded_flat_param.is_cpu: dist.all_gather(tensor_list, ...)`),
#    whose CUDA branch is all_gather_single.  memhook counts nothing allocated on a thread that
#    is neither registered nor an intra-op worker (category GLOO_THREAD).
# NCCL instead: ProcessGroupNCCL::_reduce_scatter_base and ::_allgather_base hand the user's input
# and output tensors to ncclReduceScatter / ncclAllGather (collective(input, output, ...)) and
# allocate nothing; NCCL's own channel/proxy buffers are cudaMalloc'd by NCCL at communicator
# setup, outside the caching allocator (docs/oracle.md).  Only the list-form
# ProcessGroupNCCL::allgather with same-size outputs allocates `newLikeFlat(outputTensors_)`
# through the caching allocator; the grid never calls it (the rows' gloo_scratch.calls list the
# c10d ops of the measured step: allgather_ there is FSDP1's CPU-only branch).
COLLECTIVE_CALLS = {}      # c10d op -> calls, filled by collective_calls()


def collective_calls(reset=False):
    """{c10d op: calls} since the last reset (memhook's RecordFunction callback)."""
    COLLECTIVE_CALLS.clear()
    COLLECTIVE_CALLS.update(memhook._mod.collective_calls(reset))
    return dict(COLLECTIVE_CALLS)


def install_nccl_collectives():
    """Only in a process with a process group (the RecordFunction callback slows every op)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return False
    memhook._mod.set_collective_ops(True)      # reduce-scatter input clones: GLOO_CALL
    memhook._mod.set_foreign_counted(False)    # gloo work threads' allocations: GLOO_THREAD
    return True


# --------------------------------------------------------------- install
def install(names=ALL):
    global active
    if "sdpa_cuda" in names and "sdpa" not in _orig:
        _orig["sdpa"] = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = sdpa_cuda
        torch.nn.functional.scaled_dot_product_attention = sdpa_cuda
    if "layer_norm_cuda" in names and "layer_norm" not in _orig:
        _orig["layer_norm"] = F.layer_norm
        F.layer_norm = layer_norm_cuda
    if "dropout_cuda" in names and "dropout" not in _orig:
        _orig["dropout"] = F.dropout
        F.dropout = dropout_cuda
    if "autocast_cuda" in names:
        install_cuda_autocast()
    if "conv_cudnn" in names and "conv" not in _orig:
        _orig["conv"] = True
        F.conv1d, F.conv2d, F.conv3d = _conv_patch(1), _conv_patch(2), _conv_patch(3)
    if "rng_state_host" in names and "rng" not in _orig:
        _orig["rng"] = True
        torch.get_rng_state = get_rng_state_host
        import torch.utils.checkpoint as _ckpt
        _ckpt.torch.get_rng_state = get_rng_state_host
    if "grouped_mm_cuda" in names:
        _override_cpu_kernel("_grouped_mm", _grouped_mm_cpu)
    if "embedding_backward_cuda" in names:
        _override_cpu_kernel("embedding_dense_backward", _embedding_dense_backward)
    if "softmax_backward_cuda" in names:
        _override_cpu_kernel("_softmax_backward_data", _softmax_backward_data)
    if "nccl_collectives" in names and "collectives" not in _orig:
        if install_nccl_collectives():
            _orig["collectives"] = True
    active = [n for n in ALL if n in names]
    return active


# --------------------------------------------------------------- autocast
# CUDA autocast policy for the ops whose AutocastCUDA and AutocastCPU registrations differ
# (found by torch._C._dispatch_has_kernel_for_dispatch_key over all aten ops; the policy of
# each is that of aten/src/ATen/autocast_mode.cpp's CUDA lists).  Ops only the CPU list has
# run uncast, as on CUDA.  Ops both lists have (linear, matmul, mm, bmm, addmm, baddbmm,
# conv*, sdpa, nll_loss, ...) keep the CPU autocast kernel: same policy, same weight-cast cache.
CUDA_LOWER = ("_convolution", "convolution", "addmv", "addr", "chain_matmul", "einsum", "linalg_multi_dot", "mv",
              "gru_cell", "lstm_cell", "rnn_relu_cell", "rnn_tanh_cell", "_thnn_fused_gru_cell",
              "_thnn_fused_lstm_cell")
CUDA_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log1p", "log2", "reciprocal", "rsqrt",
             "sinh", "tan", "pow.Scalar", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "softplus", "layer_norm",
             "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
             "cosine_similarity", "dist", "pdist", "renorm", "logsumexp", "rms_norm", "linalg_matrix_norm",
             "linalg_matrix_norm.str_ord", "upsample_bicubic2d", "upsample_bilinear2d", "upsample_linear1d",
             "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_trilinear3d",
             "_upsample_bicubic2d_aa", "_upsample_bilinear2d_aa", "_upsample_nearest_exact1d",
             "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "norm.Scalar", "norm.ScalarOpt_dim")
# fp32_set_opt_dtype: no input cast, the op runs with dtype=float32 unless a dtype was given
CUDA_FP32_OPT_DTYPE = ("softmax.int", "log_softmax.int", "cumsum", "cumprod", "sum", "sum.dim_IntList",
                       "linalg_vector_norm")
CUDA_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "index_put", "scatter_add",
                "tensordot")
_AUTOCAST_LIB = []


def _cast_tree(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast_tree(y, fn) for y in x)
    return x


def _autocast_kernel(opname, policy):
    name, _, overload = opname.partition(".")
    op = getattr(getattr(torch.ops.aten, name), overload or "default")
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    low = (torch.float16, torch.bfloat16)
    argnames = [a.name for a in op._schema.arguments if not a.kwarg_only]
    dtype_pos = argnames.index("dtype") if "dtype" in argnames else -1

    def k(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(keyset):
            if policy == "lower":
                dt = torch.get_autocast_dtype("cpu")
                f = lambda t: t.to(dt) if t.is_floating_point() and t.dtype != dt and t.dtype != torch.float64 else t
                args, kwargs = _cast_tree(args, f), {a: _cast_tree(b, f) for a, b in kwargs.items()}
            elif policy == "fp32":
                f = lambda t: t.float() if t.dtype in low else t
                args, kwargs = _cast_tree(args, f), {a: _cast_tree(b, f) for a, b in kwargs.items()}
            elif policy == "opt_dtype":
                if args and isinstance(args[0], torch.Tensor) and args[0].dtype in low:
                    if len(args) > dtype_pos >= 0:
                        if args[dtype_pos] is None:
                            args = args[:dtype_pos] + (torch.float32,) + args[dtype_pos + 1:]
                    elif kwargs.get("dtype") is None:
                        kwargs = dict(kwargs, dtype=torch.float32)
            elif policy == "promote":
                ts = []
                _cast_tree((args, tuple(kwargs.values())), lambda t: ts.append(t) or t)
                fl = [t.dtype for t in ts if t.is_floating_point()]
                if fl:
                    wide = torch.float32 if any(d == torch.float32 for d in fl) else fl[0]
                    f = lambda t: t.to(wide) if t.is_floating_point() and t.dtype != wide else t
                    args, kwargs = _cast_tree(args, f), {a: _cast_tree(b, f) for a, b in kwargs.items()}
            return op(*args, **kwargs)
    return k


def install_cuda_autocast():
    """Register the CUDA policy at the AutocastCPU key (see the lists above)."""
    if _AUTOCAST_LIB:
        return
    import warnings
    lib = torch.library.Library("aten", "IMPL")
    _AUTOCAST_LIB.append(lib)
    names = torch._C._dispatch_get_all_op_names()
    cpu_only = [n[6:] for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCPU")
                and not torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pol, ops in (("lower", CUDA_LOWER), ("fp32", CUDA_FP32), ("opt_dtype", CUDA_FP32_OPT_DTYPE),
                         ("promote", CUDA_PROMOTE), ("none", cpu_only)):
            for o in ops:
                try:
                    lib.impl(o, _autocast_kernel(o, pol), "AutocastCPU")
                except Exception:
                    pass
