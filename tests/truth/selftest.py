#!/usr/bin/env python3
"""Self-tests of the real-library oracle (make check-truth).

Checks the byte counter (exact, and exact under concurrent allocation from
several threads, with per-thread uncounted state), gloo's collective scratch
left out of the count, every CUDA-kernel emulation of emul.py (numerics against
the real CPU op, and the exact counted bytes -- live afterwards and the
transient peak -- against what the CUDA kernel allocates), that the tracer does
not change what is measured, and that a few tiny configs reproduce their
committed rows in data/truth.jsonl (a missing row fails): byte for byte in one
process, within GLOO_TIMING_BYTES (4 KiB, a gloo work thread's timing) with ranks.
Prints 'N passed, N failed' and exits non-zero on any failure.
"""
import json
import os
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import memhook  # noqa: E402

memhook.load()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import emul  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(2)
M = memhook._mod
emul.install(emul.ALL)
RESULTS = []


def test(fn):
    RESULTS.append(fn)
    return fn


def nbytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts)


def close(a, b, tol):
    """max |a-b| <= tol * max(1, max |b|)"""
    err = (a.float() - b.float()).abs().max().item()
    scale = max(1.0, b.float().abs().max().item())
    assert err <= tol * scale, "max abs error %g > %g x %g" % (err, tol, scale)


# ------------------------------------------------------------------ counter
@test
def counter_counts_exact_bytes():
    base = M.live()
    x = torch.empty(1000, dtype=torch.float32)
    assert M.live() - base == 4000, M.live() - base
    with memhook.uncounted():
        y = torch.empty(5000)
    assert M.live() - base == 4000
    M.reset_peak()
    z = torch.empty(250, dtype=torch.float64)
    del z
    assert M.reset_peak() - base == 6000
    del x, y
    assert M.live() == base


@test
def counter_concurrent_threads():
    """Two threads allocate and free at once (ATen releases the GIL inside the op): every byte
    and every allocation is counted once.  The old counter (`C.live += n` from every thread, no
    lock) could lose updates here."""
    sizes = [(7 + i % 13) * 64 for i in range(4000)]
    base, n0 = M.live(), M.nalloc()
    M.reset_peak()
    keep = [[], []]
    go = threading.Barrier(2)

    def work(k):
        M.register_thread(False)
        go.wait()
        for i, n in enumerate(sizes):
            t = torch.empty(n, dtype=torch.uint8)
            if i % 2:
                keep[k].append(t)
            del t
    ts = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    kept = 2 * sum(n for i, n in enumerate(sizes) if i % 2)
    assert M.live() - base == kept, (M.live() - base, kept)
    assert M.nalloc() - n0 == 2 * len(sizes), (M.nalloc() - n0, 2 * len(sizes))
    assert kept <= M.reset_peak() - base <= kept + 2 * max(sizes)
    keep.clear()
    assert M.live() == base, (M.live(), base)
    # and at full contention: C++ threads through c10's CPU allocator, no GIL
    base, n0 = M.live(), M.nalloc()
    # (without memhook's lock this lost 190 of 80,000 allocations and 4,984 bytes here)
    r = M.stress(4, 50000)
    assert r == [4 * 50000, 0], r                           # allocations seen, bytes left live
    assert M.nalloc() - n0 == 4 * 50000 and M.live() == base, (M.nalloc() - n0, M.live() - base)


@test
def uncounted_is_per_thread():
    """One thread inside uncounted() does not hide another thread's allocations (the old single
    global flag did), and frees are counted exactly as their allocations were."""
    base = M.live()
    inside, done = threading.Event(), threading.Event()
    box = {}

    def other():
        M.register_thread(False)
        inside.wait()
        box["t"] = torch.empty(12345, dtype=torch.uint8)
        done.set()
    t = threading.Thread(target=other)
    t.start()
    with memhook.uncounted():
        hidden = torch.empty(50000, dtype=torch.uint8)
        inside.set()
        done.wait()
    t.join()
    assert M.live() - base == 12345, M.live() - base
    del hidden
    assert M.live() - base == 12345, M.live() - base
    box.clear()
    assert M.live() == base


@test
def gloo_collective_scratch_not_counted():
    """gloo's reduce-scatter clones its input on the calling thread, its all-gathers allocate a
    full-size copy for the flight recorder on the calling thread and a flat output on a work
    thread (emul.py "collectives"); NCCL allocates none of them.  A one-rank gloo group: the
    counted peak of each call is 0, the scratch is in its category, byte for byte."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert emul.install_nccl_collectives()
    live0 = M.live()
    inp = torch.randn(4096)
    out = torch.empty(4096)
    n = nbytes(inp)
    # reduce-scatter: the input clone on this thread; all-gather: the flight recorder's
    # newLikeFlat on this thread and the flat output on a work thread
    for op, want in ((lambda: dist.reduce_scatter_single(out, inp), {memhook.GLOO_CALL: n, memhook.GLOO_THREAD: 0}),
                     (lambda: dist.all_gather_single(out, inp), {memhook.GLOO_CALL: n, memhook.GLOO_THREAD: n}),
                     (lambda: dist.all_gather([out], inp), {memhook.GLOO_CALL: n, memhook.GLOO_THREAD: n})):
        M.reset_category_peaks()
        base = M.live()
        M.reset_peak()
        op()
        pk = M.reset_peak() - base
        assert pk == 0 and M.live() == base, (pk, M.live() - base, M.category_stats(memhook.GLOO_CALL),
                                              M.category_stats(memhook.GLOO_THREAD))
        got = {c: M.category_stats(c)[2] for c in (memhook.GLOO_CALL, memhook.GLOO_THREAD)}
        assert got == want, got
        # had it been counted: the clone, or the larger of the flight-recorder copy / flat output
        assert M.shadow_peak() - base in (nbytes(inp), 2 * nbytes(inp)), M.shadow_peak() - base
    calls = emul.collective_calls(reset=True)
    assert calls.get("c10d::_reduce_scatter_base_") == 1 and calls.get("c10d::_allgather_base_") == 1, calls
    assert calls.get("c10d::allgather_") == 1, calls
    # a gloo work thread still holds the last work's inputs and outputs for a moment after
    # wait() returns (ProcessGroupGloo::runLoop keeps `work` until workInProgress_ is reset),
    # so these two counted tensors can be freed on that thread while the next test measures:
    # wait, bounded, until they are gone, and fail if they never are
    del inp, out
    deadline = time.monotonic() + 10
    while M.live() != live0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert M.live() == live0, ("gloo never released the collectives' tensors", M.live() - live0)


# ------------------------------------------------------------------ SDPA
def _ref_sdpa(q, k, v, mask, causal, gqa):
    qq, kk, vv = (t.detach().float().requires_grad_() for t in (q, k, v))
    o = emul._REAL_SDPA(qq, kk, vv, attn_mask=mask, is_causal=causal,
                        enable_gqa=gqa)
    return o, (qq, kk, vv)


def _sdpa_kernel_tensors(kind, B, H, Hk, L, S, D, es, out_bytes, mask_elems=0):
    """The tensors the emulated CUDA kernel allocates, in bytes: (kept for the
    backward by the forward, the backward's own buffers besides dq/dk/dv).
    flash: out, lse (B,H,L) fp32, rng_state 16 B, unused 8 B; backward softmax_d
    (B,H,round128(L)) and dq_accum (B,round128(L),H,round32(D), 64 past 128) fp32, and
    with GQA dk/dv expanded to H heads.  efficient: out, logsumexp (B,H,round32(L)) fp32,
    a q-dtype copy of a mask (last dim padded to 16); backward delta (B,H,L) fp32 and,
    16-bit, an fp32 grad_q accumulator (B,L,H,D)."""
    r = lambda n, m: (n + m - 1) // m * m
    if kind == "flash":
        kept = [out_bytes, B * H * L * 4, 16, 8]
        extra = [B * H * r(L, 128) * 4, B * r(L, 128) * H * r(D, 32 if D <= 128 else 64) * 4]
        if Hk != H:
            extra += [B * S * H * D * es] * 2
        return kept, extra
    kept = [out_bytes, B * H * r(L, 32) * 4]
    if mask_elems:
        kept.append(mask_elems // S * r(S, 16) * es)
    extra = [B * H * L * 4] + ([B * L * H * D * 4] if es != 4 else [])
    return kept, extra


def _sdpa_case(dtype, B, H, Hk, L, D, causal, mask, expect_kind, dropout=0.0):
    q = torch.randn(B, L, H, D, dtype=dtype).transpose(1, 2).requires_grad_()   # HF layout (B,H,L,D) view
    k = torch.randn(B, Hk, L, D, dtype=dtype).requires_grad_()
    v = torch.randn(B, Hk, L, D, dtype=dtype).requires_grad_()
    gqa = Hk != H
    kind = emul.sdpa_backend(q, k, v, mask, dropout, causal, gqa)
    assert kind == expect_kind, (kind, expect_kind)
    gc_base = M.live()
    M.reset_peak()
    out = emul.sdpa_cuda(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, enable_gqa=gqa)
    fwd = M.live() - gc_base
    es = q.element_size()
    kept, extra = _sdpa_kernel_tensors(kind, B, H, Hk, L, L, D, es, nbytes(out),
                                       mask.numel() if mask is not None else 0)
    want = sum(kept) if kind in ("flash", "efficient") else None
    if kind in ("flash", "efficient"):
        assert out.transpose(1, 2).is_contiguous(), \
            "flash out shares q's (B,L,H,D) layout; efficient out is (B,M,H,K) storage"
    if want is not None:
        assert fwd == want, "forward counted %d, CUDA kernel allocates %d" % (fwd, want)
        assert M.reset_peak() - gc_base == want, "forward transient peak above what the kernel allocates"
    g = torch.randn_like(out)
    M.reset_peak()
    before = M.live()
    out.backward(g)
    bwd_peak = M.reset_peak() - before
    ref, (qq, kk, vv) = _ref_sdpa(q, k, v, mask, causal, gqa)
    ref.backward(g.float())
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    close(out, ref, tol * 4)
    close(q.grad, qq.grad, tol * 8)
    close(k.grad, kk.grad, tol * 8)
    close(v.grad, vv.grad, tol * 8)
    # backward peak: dq, dk, dv (they become the leaves' .grad) + the kernel's buffers
    if kind in ("flash", "efficient"):
        assert bwd_peak == nbytes(q, k, v) + sum(extra), (bwd_peak, nbytes(q, k, v) + sum(extra))
    return kind


SDPA_CASES = [
    # name, dtype, B, H, Hk, L, D, causal, mask, backend CUDA picks
    ("flash_bf16_causal_gqa", torch.bfloat16, 2, 4, 2, 96, 32, True, None, "flash"),
    ("flash_bf16_noncausal", torch.bfloat16, 1, 2, 2, 40, 64, False, None, "flash"),
    ("efficient_fp32", torch.float32, 2, 2, 2, 50, 32, True, None, "efficient"),
    ("efficient_bf16_mask", torch.bfloat16, 1, 2, 2, 64, 32, False,
     torch.ones(64, 64, dtype=torch.bool).tril()[None, None], "efficient"),
    # fp32 + GQA: flash needs 16-bit, mem-efficient has no GQA -> math (S x S materialised)
    ("math_fp32_gqa", torch.float32, 1, 4, 2, 48, 32, True, None, "math"),
    # dropout > 0 keeps the fused backends (flash and mem-efficient take dropout on CUDA)
    ("flash_bf16_dropout", torch.bfloat16, 1, 2, 2, 40, 64, True, None, "flash", 0.1),
    ("efficient_fp32_dropout", torch.float32, 1, 2, 2, 50, 32, False, None, "efficient", 0.1),
]


@test
def sdpa_backends():
    for case in SDPA_CASES:
        try:
            _sdpa_case(*case[1:])
        except AssertionError as e:
            raise AssertionError("%s: %s" % (case[0], e))


SDPA_GPU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu_data", "sdpa",
                        "h200.jsonl")


def _r512(n):
    return (n + 511) // 512 * 512


def _sdpa_stand_in(c, kind):
    """What the emulation's kernel keeps after the forward and adds in the backward
    (besides dq/dk/dv), each tensor in the caching allocator's 512-B blocks."""
    es = 4 if c["dtype"] == "float32" else 2
    masked = c["mask"] == "bool" or (c["mask"] and c["S"] % 16)
    kept, extra = _sdpa_kernel_tensors(kind, c["B"], c["H"], c["Hk"], c["L"], c["S"], c["D"], es,
                                       c["B"] * c["H"] * c["L"] * c["D"] * es,
                                       c["B"] * c["L"] * c["S"] if masked else 0)
    return sum(map(_r512, kept)), sum(map(_r512, extra))


@test
def sdpa_backend_on_a_gpu():
    """tests/gpu_data/sdpa/h200.jsonl (contrib/calibrate/sdpa_probe.py; H200, torch 2.11.0+cu130,
    cuDNN 9.19): fp32 shapes get the backend the emulation picks.  16-bit ones got cuDNN
    attention (sdp_utils.cpp check_prefer_cudnn_attention: cuDNN > 9.15 on sm90 goes first),
    which the emulation does not model: its flash / mem-efficient stand-in must keep the same
    bytes for backward (within 1 KiB: cuDNN's seed and offset blocks) and add the same
    backward buffers (within 512 B) where L is a multiple of 128 and D of 32.  Printed, not
    held: other L and D (cuDNN rounds neither; flash's dq accumulator rounds both) and fp32 mem-efficient backward, whose kernel took a
    workspace the emulation lacks (grad accumulators when it splits the keys over SMs:
    attention_backward.cu, workspace_size; it depends on the GPU's SM count)."""
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    rows = [json.loads(x) for x in open(SDPA_GPU)]
    cases = [r for r in rows if r.get("kind") != "env" and r.get("status") == "ok"]
    assert len(cases) == 30, len(cases)
    for r in cases:
        c = r["case"]
        dt = getattr(torch, c["dtype"])
        q = torch.empty(c["B"], c["H"], c["L"], c["D"], dtype=dt, device="meta")
        k = torch.empty(c["B"], c["Hk"], c["S"], c["D"], dtype=dt, device="meta")
        m = torch.empty(c["B"], 1, c["L"], c["S"], dtype=torch.bool if c["mask"] == "bool" else dt,
                        device="meta") if c["mask"] else None
        kind = emul.sdpa_backend(q, k, k, m, 0.0, c["causal"], c["enable_gqa"])
        if c["dtype"] == "float32":
            assert names[kind] == r["backend"], (c["name"], kind, r["backend"])
        else:
            assert r["backend"] == "CUDNN_ATTENTION", (c["name"], r["backend"])
        if kind == "math":
            continue
        kept, extra = _sdpa_stand_in(c, kind)
        es = 4 if c["dtype"] == "float32" else 2
        grads = sum(_r512(c["B"] * h * n * c["D"] * es) for h, n in
                    ((c["H"], c["L"]), (c["Hk"], c["S"]), (c["Hk"], c["S"])))
        got_extra = r["backward_peak_above_forward"] - grads
        # cuDNN takes the mask unpadded: the stand-in's padding to 16 is the one more
        pad = 0
        if es == 2 and c["mask"] and c["S"] % 16:
            pad = (_r512(c["B"] * c["L"] * ((c["S"] + 15) // 16 * 16) * es)
                   - _r512(c["B"] * c["L"] * c["S"] * es))
        assert abs(r["forward_kept"] + pad - kept) <= 1024, (c["name"], r["forward_kept"], kept)
        if c["L"] % 128 == 0 and c["D"] % 32 == 0 and es == 2:
            assert abs(got_extra - extra) <= 512, (c["name"], got_extra, extra)
        else:
            print("  sdpa %s: backward buffers %d on the GPU, %d emulated (%+.1f %%)" % (
                c["name"], got_extra, extra, (extra - got_extra) * 100.0 / got_extra))


# ------------------------------------------------------------------ LayerNorm
@test
def layer_norm_fp32_stats_for_bf16():
    x = torch.randn(6, 10, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    base = M.live()
    M.reset_peak()
    y = F.layer_norm(x, (32,), w, b, 1e-5)
    # output + mean + rstd in fp32 (60 rows), live afterwards and at the transient peak
    assert M.live() - base == nbytes(y) + 2 * 60 * 4, M.live() - base
    assert M.reset_peak() - base == nbytes(y) + 2 * 60 * 4
    g = torch.randn_like(y)
    y.backward(g)
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    yr = emul._REAL_LN(xr, (32,), wr, br, 1e-5)
    yr.backward(g.float())
    close(y, yr, 3e-2)
    close(x.grad, xr.grad, 6e-2)
    close(w.grad, wr.grad, 3e-2)
    close(b.grad, br.grad, 3e-2)


# ------------------------------------------------------------------ dropout
@test
def dropout_allocates_what_native_dropout_cuda_does():
    """CUDA native_dropout: output + bool mask, nothing else (the CPU kernel's dtype-sized noise
    tensor made the peak 5,242,880 B for a 1M-element bf16 input); backward: one gradient."""
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1024, 1024, dtype=dtype, requires_grad=True)
        base = M.live()
        M.reset_peak()
        y = F.dropout(x, 0.25, True)
        want = nbytes(y) + x.numel()                      # output + bool mask (saved)
        assert M.reset_peak() - base == want, (dtype, M.reset_peak() - base, want)
        assert M.live() - base == want, (dtype, M.live() - base, want)
        g = torch.randn_like(y)
        base = M.live()
        M.reset_peak()
        y.backward(g)
        assert M.reset_peak() - base == nbytes(x), (dtype, M.reset_peak() - base)   # grad_input only
        kept = (y != 0)
        close(x.grad, kept.to(dtype) * g / 0.75, 1e-2 if dtype == torch.bfloat16 else 1e-6)
        del x, y, g, kept
    x = torch.randn(1024, 1024, dtype=torch.bfloat16)
    with torch.no_grad():                                 # the mask is made, then dropped
        base = M.live()
        M.reset_peak()
        y = F.dropout(x, 0.1, True)
        assert M.reset_peak() - base == nbytes(y) + x.numel() and M.live() - base == nbytes(y)


# ------------------------------------------------------------------ convolution
@test
def conv_valid_padding_emulated():
    """padding="valid" (SigLIP, Idefics3, SmolVLM, Mllama patch embeddings) goes through the
    cuDNN emulation: under autocast the output is bf16 (CUDA autocasts `convolution`), counted
    are the casts and the output only, with and without grad."""
    x = torch.randn(2, 3, 32, 32)
    w = torch.randn(16, 3, 4, 4, requires_grad=True)
    ref = emul._orig_conv2d(x, w.detach(), None, 4, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for grad in (True, False):
            with torch.set_grad_enabled(grad):
                base = M.live()
                M.reset_peak()
                y = F.conv2d(x, w, None, 4, "valid")
                assert y.dtype == torch.bfloat16, y.dtype
                want = nbytes(y) + x.numel() * 2 + w.numel() * 2          # bf16 casts of x and w
                assert M.reset_peak() - base == want, (grad, M.reset_peak() - base, want)
                assert M.live() - base == (want if grad else nbytes(y)), (grad, M.live() - base)
                close(y, ref, 5e-2)
                if grad:                 # backward: the numerics (its bytes: _ConvCudnn.backward)
                    g = torch.randn(y.shape)
                    y.backward(g.to(y.dtype))
                    wr = w.detach().clone().requires_grad_()
                    emul._orig_conv2d(x, wr, None, 4, 0).backward(g)
                    close(w.grad, wr.grad, 5e-2)
                    w.grad = None
                del y
    base = M.live()
    M.reset_peak()
    y = F.conv2d(x, w.detach(), None, 4, "valid")                  # fp32, no grad: output only
    assert M.reset_peak() - base == nbytes(y) and y.dtype == torch.float32
    close(y, ref, 1e-4)


# ------------------------------------------------------------------ autocast
@test
def autocast_cuda_policy():
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(16, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.exp(x).dtype == torch.float32            # CUDA fp32 list
        assert x.pow(2).dtype == torch.float32
        base = M.live()
        s = torch.softmax(x, -1)                              # fp32_set_opt_dtype: no input copy
        assert s.dtype == torch.float32 and M.live() - base == nbytes(s)
        assert F.linear(x.float(), w).dtype == torch.bfloat16  # lower precision on both
        assert torch.einsum("ij,jk->ik", x.float(), w).dtype == torch.bfloat16   # CUDA-only lower
        assert F.layer_norm(x, (16,)).dtype == torch.float32
        assert torch.stack([x, x]).dtype == torch.bfloat16     # CPU-only promote list: untouched


# ------------------------------------------------------------------ grouped_mm
@test
def grouped_mm_output_only():
    a = torch.randn(20, 16, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, 16, 24, dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor([5, 5, 12, 20], dtype=torch.int32)
    base = M.live()
    M.reset_peak()
    o = F.grouped_mm(a, b, offs=offs)
    assert M.live() - base == nbytes(o), M.live() - base
    assert M.reset_peak() - base == nbytes(o), M.reset_peak() - base
    g = torch.randn_like(o)
    o.backward(g)
    ref = torch.cat([a[0:5] @ b[0], a[5:5] @ b[1], a[5:12] @ b[2], a[12:20] @ b[3]])
    close(o, ref, 1e-1)
    ar, br = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    rr = torch.cat([ar[0:5] @ br[0], ar[5:12] @ br[2], ar[12:20] @ br[3]])
    rr.backward(torch.cat([g[0:5], g[5:12], g[12:20]]).float())
    close(a.grad, ar.grad, 2e-1)
    close(b.grad, br.grad, 4e-1)


# ------------------------------------------------------------------ embedding backward
@test
def embedding_backward_small_and_large():
    for n, extra_expected in ((100, False), (4000, True)):
        V, H = 500, 64
        w = torch.randn(V, H, requires_grad=True)
        idx = torch.randint(0, V, (n,))
        y = F.embedding(idx, w)
        g = torch.randn_like(y)
        M.reset_peak()
        before = M.live()
        y.backward(g)
        peak = M.reset_peak() - before
        ref = torch.zeros(V, H).index_add_(0, idx, g)
        close(w.grad, ref, 1e-4)
        gw = V * H * 4
        if extra_expected:
            it = 8
            max_seg = min(n, V)
            scratch = 3 * n * it + 8 + 2 * max_seg * it + 8 + (n // 10 + max_seg) * it + (n // 10 + max_seg) * H * 4
            assert peak == gw + scratch, (peak, gw + scratch)
        else:
            assert peak == gw, (peak, gw)                 # the direct kernel: grad_weight only


# ------------------------------------------------------------------ softmax backward
@test
def softmax_backward_holds_grad_times_output():
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 3, 40, 50, dtype=torch.bfloat16, requires_grad=True)
        p = torch.softmax(x, -1, dtype=torch.float32).to(dt)   # eager attention's upcast
        g = torch.randn_like(p)
        M.reset_peak()
        before = M.live()
        p.backward(g)
        peak = M.reset_peak() - before
        ref = x.detach().float().requires_grad_()
        with torch.no_grad():
            s = torch.softmax(ref, -1)
            want = s * (g.float() - (g.float() * s).sum(-1, keepdim=True))
        close(x.grad, want, 2e-2)
        n = x.numel()
        # ToCopyBackward: fp32 grad (bf16 case; the fp32 p has no copy), then grad_input and
        # tmp (fp32 each) beside it, then the bf16 input gradient once they are gone
        expect = (n * 4 if dt != torch.float32 else 0) + 2 * n * 4
        assert peak == expect, (peak, expect)


# ------------------------------------------------------------------ AdamW host steps
@test
def adamw_steps_moved_to_host():
    ps = [torch.nn.Parameter(torch.randn(10)) for _ in range(3)]
    opt = torch.optim.AdamW(ps, foreach=True)
    for p in ps:
        p.grad = torch.randn(10)
    opt.step()
    before = M.live()
    emul.hostify_adam_steps(opt)
    assert before - M.live() == 3 * 4, before - M.live()     # three fp32 0-dim steps left the count
    opt.step()                                                # still steps
    assert int(opt.state[ps[0]]["step"]) == 2


# ------------------------------------------------------------------ FSDP2 accumulation
@test
def fsdp2_accumulate_adds_without_a_cpu_temporary():
    """accum.py fsdp2_accumulate_cuda: under set_requires_gradient_sync(False) with a bf16/fp32
    MixedPrecisionPolicy the bf16 gradient is added into the fp32 accumulated one; the CPU add_
    makes an fp32 temporary (TensorIterator, CPU only) that the emulation leaves uncounted: the
    backward's peak is exactly one fp32 copy of the weight lower, the sum the same."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    import accum
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    emul.install_nccl_collectives()
    m = torch.nn.Linear(256, 256, bias=False)
    fully_shard(m, mesh=init_device_mesh("cpu", (1,)),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    m.set_requires_gradient_sync(False)
    x = torch.randn(4, 256)
    m(x).sum().backward()
    fp = m._get_fsdp_state()._fsdp_param_group.fsdp_params[0]
    one = fp.unsharded_accumulated_grad.clone()
    assert one.dtype == torch.float32
    cls = type(fp)
    peaks = []

    def probe(fn):                      # the counted peak inside the accumulation call
        def run(self):
            base = M.live()
            M.reset_peak()
            fn(self)
            peaks.append(M.reset_peak() - base)
        return run
    for patched in (True, False):
        if patched:
            assert accum.fsdp2_accumulate_cuda()
        else:
            cls._truth_accumulate_cuda = False
        fn = cls.accumulate_unsharded_grad_if_needed if patched else accum._ORIG["accumulate"]
        cls.accumulate_unsharded_grad_if_needed = probe(fn)
        m(x).sum().backward()
        cls.accumulate_unsharded_grad_if_needed = fn
    assert peaks == [0, 256 * 256 * 4], peaks
    close(fp.unsharded_accumulated_grad, 3 * one, 1e-5)


@test
def peft_mixed_add_without_a_cpu_copy():
    """emul_peft.py: inside a PEFT LoRA forward, bf16 + fp32 (layer.py:1102 with fp32 adapters)
    costs its fp32 output only; the CPU add's fp32 copy of the bf16 operand (TensorIterator,
    CPU only) is left uncounted.  Outside a LoRA forward the add is untouched; the sum, its
    dtype and its gradients are the real add's; a patched PEFT layer computes the same output."""
    from peft import LoraConfig, get_peft_model
    import emul_peft
    m = torch.nn.Sequential(torch.nn.Linear(64, 512, bias=False)).to(torch.bfloat16)
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["0"]))
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = pm(x)
    assert emul_peft.patch_model(pm) == ["peft_mixed_add_cuda"]
    with torch.no_grad():
        close(pm(x), ref, 0)
    a = torch.randn(32, 512, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(32, 512, requires_grad=True)
    peaks, sums = [], []
    for inside in (0, 1):
        emul_peft._STATE.depth = inside
        base = M.live()
        M.reset_peak()
        sums.append(a + b)
        peaks.append(M.reset_peak() - base)
    emul_peft._STATE.depth = 0
    assert peaks == [32 * 512 * 8, 32 * 512 * 4], peaks
    assert sums[1].dtype == torch.float32 and type(sums[1].grad_fn).__name__ == "AddBackward0"
    close(sums[1], sums[0], 0)
    sums[1].sum().backward()
    assert a.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.float32


# ------------------------------------------------------------------ end to end

# ------------------------------------------------------------------ Liger (emul_liger.py)
@test
def liger_rms_norm_allocates_what_liger_does():
    """forward: Y + fp32 RSTD (one per row); backward: dX over dY in place, fp32 (132, H)
    partial sums, their fp32 sum and its bf16 cast (the sum freed)."""
    import emul_liger as L
    x = torch.randn(6, 10, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    base = M.live()
    M.reset_peak()
    y = L.LigerRMSNormEmul.apply(x, w, 1e-6)
    assert M.live() - base == nbytes(y) + 60 * 4, M.live() - base
    assert M.reset_peak() - base == nbytes(y) + 60 * 4
    g = torch.randn_like(y)
    live0 = M.live()
    M.reset_peak()
    y.backward(g.clone())
    # x.grad is the incoming gradient clone, dX written over it (in_place); w.grad (64 B) stays;
    # RSTD leaves with the saved tensors.  Peak: clone + _dW (132 x 32 fp32) + fp32 sum + bf16 dW
    lv, pk = M.live() - live0, M.reset_peak() - live0
    assert lv == nbytes(g) + 64 - 60 * 4, lv           # + w.grad, - the freed RSTD
    assert pk == nbytes(g) + L.SM_COUNT * 32 * 4 + 32 * 4 + 64, pk
    xr, wr = (t.detach().float().requires_grad_() for t in (x, w))
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    yr.backward(g.float())
    close(y, yr, 3e-2)
    close(x.grad, xr.grad, 6e-2)
    close(w.grad, wr.grad, 6e-2)


@test
def liger_swiglu_saves_a_b_and_backward_writes_in_place():
    import emul_liger as L
    a = torch.randn(4, 8, 48, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, 8, 48, dtype=torch.bfloat16, requires_grad=True)
    a2, b2 = a * 1, b * 1                 # non-leaf inputs, as gate_proj/up_proj outputs are
    base = M.live()
    M.reset_peak()
    c = L.LigerSiLUMulEmul.apply(a2, b2)
    assert M.live() - base == nbytes(c) and M.reset_peak() - base == nbytes(c)
    g = torch.randn_like(c)
    pa, pb = a2.data_ptr(), b2.data_ptr()
    live0 = M.live()
    M.reset_peak()
    da, db = torch.autograd.grad(c, (a2, b2), g)
    # the gradients are written over the saved a and b: backward allocates nothing
    lv, pk = M.live() - live0, M.reset_peak() - live0
    assert (lv, pk) == (0, 0), (lv, pk)
    assert (da.data_ptr(), db.data_ptr()) == (pa, pb)
    a.grad, b.grad = da, db
    ar, br = (t.detach().float().requires_grad_() for t in (a, b))
    (F.silu(ar) * br).backward(g.float())
    close(a.grad, ar.grad, 6e-2)
    close(b.grad, br.grad, 6e-2)


@test
def liger_rope_rotates_in_place():
    import emul_liger as L
    B, H, Hk, S, D = 2, 4, 2, 6, 16
    qs = torch.randn(B, S, H * D, requires_grad=True)
    ks = torch.randn(B, S, Hk * D, requires_grad=True)
    ang = torch.randn(1, S, D // 2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    q0 = qs * 1
    k0 = ks * 1
    q = q0.view(B, S, H, D).transpose(1, 2)
    k = k0.view(B, S, Hk, D).transpose(1, 2)
    base = M.live()
    M.reset_peak()
    qo, ko = L.liger_rotary_pos_emb(q, k, cos, sin)
    lv, pk = M.live() - base, M.reset_peak() - base
    assert (lv, pk) == (0, 0), (lv, pk)                  # rotated in place, cos/sin already contiguous
    assert qo.data_ptr() == q0.data_ptr()
    def rh(t):
        return torch.cat((-t[..., D // 2:], t[..., : D // 2]), -1)
    qr, kr = (t.detach().view(B, S, -1, D).transpose(1, 2) for t in (qs, ks))
    qe = qr * cos.unsqueeze(1) + rh(qr) * sin.unsqueeze(1)
    close(qo, qe, 1e-5)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    (qo * gq).sum().add_((ko * gk).sum()).backward()
    qa, ka = (t.detach().clone().requires_grad_() for t in (qs, ks))
    qv, kv = (t.view(B, S, -1, D).transpose(1, 2) for t in (qa, ka))
    ((qv * cos.unsqueeze(1) + rh(qv) * sin.unsqueeze(1)) * gq).sum().add_(
        ((kv * cos.unsqueeze(1) + rh(kv) * sin.unsqueeze(1)) * gk).sum()).backward()
    close(qs.grad, qa.grad, 1e-5)
    close(ks.grad, ka.grad, 1e-5)


@test
def liger_layer_norm_allocates_what_liger_does():
    """forward: Y + Mean + RSTD in X's dtype (bf16, one per row); backward: a new DX, fp32
    (132, H) _DW and _DB, their sums cast to the weights' dtype."""
    import emul_liger as L
    x = torch.randn(6, 10, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    base = M.live()
    M.reset_peak()
    y = L.LigerLayerNormEmul.apply(x, w, b, 1e-6)
    assert M.live() - base == nbytes(y) + 2 * 60 * 2, M.live() - base
    g = torch.randn_like(y)
    live0 = M.live()
    M.reset_peak()
    y.backward(g)
    # x.grad (a new DX), w.grad and b.grad stay; Mean and RSTD leave with the saved tensors
    lv, pk = M.live() - live0, M.reset_peak() - live0
    assert lv == nbytes(x) + 2 * 64 - 2 * 60 * 2, lv
    # peak at DB's cast: DX + _DW + _DB + bf16 DW + fp32 DB sum + bf16 DB
    assert pk == nbytes(x) + 2 * L.SM_COUNT * 32 * 4 + 64 + 32 * 4 + 64, pk
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    F.layer_norm(xr, (32,), wr, br, 1e-6).backward(g.float())
    close(x.grad, xr.grad, 6e-2)
    close(w.grad, wr.grad, 1e-1)
    close(b.grad, br.grad, 6e-2)


@test
def liger_geglu_saves_a_b_and_backward_writes_in_place():
    import emul_liger as L
    a = torch.randn(4, 8, 48, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, 8, 48, dtype=torch.bfloat16, requires_grad=True)
    a2, b2 = a * 1, b * 1
    base = M.live()
    M.reset_peak()
    c = L.LigerGELUMulEmul.apply(a2, b2)
    assert M.live() - base == nbytes(c) and M.reset_peak() - base == nbytes(c)
    g = torch.randn_like(c)
    pa, pb = a2.data_ptr(), b2.data_ptr()
    live0 = M.live()
    M.reset_peak()
    da, db = torch.autograd.grad(c, (a2, b2), g)
    assert (M.live() - live0, M.reset_peak() - live0) == (0, 0)
    assert (da.data_ptr(), db.data_ptr()) == (pa, pb)
    ar, br = (t.detach().float().requires_grad_() for t in (a, b))
    (F.gelu(ar, approximate="tanh") * br).backward(g.float())
    close(da, ar.grad, 6e-2)
    close(db, br.grad, 6e-2)


@test
def liger_rms_norm_gemma_is_not_in_place():
    """Gemma 3's patch (offset 1, gemma casting, in_place False): dX = zeros_like(dY), a new
    tensor beside the incoming gradient."""
    import emul_liger as L
    x = torch.randn(6, 10, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    y = L.LigerRMSNormEmul.apply(x, w, 1e-6, 1.0, True, False)
    g = torch.randn_like(y)
    live0 = M.live()
    M.reset_peak()
    y.backward(g)
    lv = M.live() - live0
    assert lv == nbytes(x) + 64 - 60 * 4, lv          # x.grad new, w.grad; RSTD freed
    xr, wr = (t.detach().float().requires_grad_() for t in (x, w))
    yr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + wr)
    yr.backward(g.float())
    close(y, yr, 3e-2)
    close(x.grad, xr.grad, 6e-2)


@test
def liger_mrope_rotates_in_place_and_saves_cos_sin():
    """LigerQwen2VLMRopeFunction: q, k rotated in place with the sections' cos / sin
    (3, b, s, d) recomposed in registers; nothing allocated."""
    import emul_liger as L
    B, H, S, D, sec = 1, 2, 5, 16, [2, 3, 3]
    qs = torch.randn(B, S, H * D, requires_grad=True)
    ks = torch.randn(B, S, H * D, requires_grad=True)
    ang = torch.randn(3, B, S, D // 2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    q0, k0 = qs * 1, ks * 1
    q = q0.view(B, S, H, D).transpose(1, 2)
    k = k0.view(B, S, H, D).transpose(1, 2)
    base = M.live()
    M.reset_peak()
    qo, ko = L.liger_multimodal_rotary_pos_emb(q, k, cos, sin, sec)
    assert (M.live() - base, M.reset_peak() - base) == (0, 0)
    assert qo.data_ptr() == q0.data_ptr()
    def pick(t):
        return torch.cat([m[i % 3] for i, m in enumerate(t.split(sec * 2, dim=-1))], dim=-1).unsqueeze(1)
    c, s_ = pick(cos), pick(sin)
    def rh(t):
        return torch.cat((-t[..., D // 2:], t[..., : D // 2]), -1)
    qr = qs.detach().view(B, S, H, D).transpose(1, 2)
    close(qo, qr * c + rh(qr) * s_, 1e-5)

def _row(setup, trace=False):
    args = [sys.executable, os.path.join(HERE, "truth.py"), "run", json.dumps(setup)]
    if trace:
        args.append("--trace")
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def smoke_setups():
    import selftest_configs
    return selftest_configs.setups()[1:]


@test
def tracer_does_not_change_the_measurement():
    s = smoke_setups()[0]
    a, b = _row(s), _row(s, trace=True)
    assert a["measured"]["phase_peak_bytes"] == b["measured"]["phase_peak_bytes"], (a["measured"], b["measured"])


@test
def smoke_rows_match_committed_data():
    path = os.path.join(HERE, "data", "truth.jsonl")
    committed = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                d = json.loads(line)
                committed[d["id"]] = d
    for s in smoke_setups():
        r = _row(s)
        m = r["measured"]
        assert m["peak_bytes"] >= max(x["start_bytes"] for x in m["ranks"])
        assert len(m["ranks"]) == s["world_size"]
        assert s["id"] in committed, "no committed row for %s in %s: measure it (truth.py generate)" % (s["id"], path)
        c = committed[s["id"]]["measured"]
        tol = GLOO_TIMING_BYTES if s["world_size"] > 1 else 0
        for ph in c["phase_peak_bytes"]:
            assert abs(c["phase_peak_bytes"][ph] - m["phase_peak_bytes"][ph]) <= tol, (
                s["id"], ph, c["phase_peak_bytes"], m["phase_peak_bytes"])
        assert abs(c["peak_bytes"] - m["peak_bytes"]) <= tol, (s["id"], c["peak_bytes"], m["peak_bytes"])


# Distributed rows: a counted tensor whose last reference is a gloo Work object is freed when
# gloo's work thread drops that Work, so whether it is still alive at a phase's peak depends on
# thread timing (llama-fsdp2-2: the backward peak of a rank measured 140,034,540 or 140,032,988 B,
# a 1,552-byte tensor).  Bounded here, not hidden; single-process rows are compared exactly.
GLOO_TIMING_BYTES = 4096


@test
def fsdp2_row_is_repeatable():
    """With gloo's scratch out of the count, the FSDP2 smoke row measures every phase twice in a row
    within GLOO_TIMING_BYTES (the optimizer phase once swung 89.2 / 104.1 MB with the comm thread)."""
    s = [x for x in smoke_setups() if x["parallel"] == "fsdp2"][0]
    a, b = _row(s), _row(s)
    pa, pb = a["measured"]["phase_peak_bytes"], b["measured"]["phase_peak_bytes"]
    for ph in pa:
        assert abs(pa[ph] - pb[ph]) <= GLOO_TIMING_BYTES, (ph, pa, pb)
    for r in a["measured"]["ranks"]:
        assert r["gloo_scratch"]["call_bytes"] > 0 and r["gloo_scratch"]["thread_bytes"] > 0, r["gloo_scratch"]


def main():
    only = sys.argv[1:]
    ok = bad = 0
    for fn in RESULTS:
        if only and not any(o in fn.__name__ for o in only):
            continue
        try:
            fn()
            ok += 1
            print("PASS", fn.__name__, flush=True)
        except Exception:
            bad += 1
            print("FAIL", fn.__name__, flush=True)
            traceback.print_exc()
    print("%d passed, %d failed" % (ok, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
