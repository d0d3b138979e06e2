#!/usr/bin/env python3
"""The FP8 variants' correctness rule for bench/gpu/v3/harness.py: the naive same-precision baseline on the device's
own FP8 GEMM, and the 2x rule on out and lse (the harness side of tests/cuda/fp8_test_util.hpp naive_fp8 +
fp8_gemm_cublaslt.hpp + test_attention_fp8_cuda.cpp's check).

Why: Hopper's e4m3 tensor-core MMA keeps ~13-14 mantissa bits in its accumulator (DeepSeek-V3 §3.3.2), so every FP8
attention kernel's scores, hence its lse, are 1e-4..2e-3 from the float64 lse of the e4m3 values (FA3's FP8 lse equals
ours within 1.4e-6: bench/results/h200-2026-12-01-run6/README.md call 3, bench/gpu/fp8_lse_probe.py). A baseline with
exact float32 sums (1e-6 from float64) or a fixed 1e-3 lse bound therefore judges the hardware, not the kernel.

Baseline (naive_fp8): per (batch, head) slice, S = q8 . k8^T on torch._scaled_mm (e4m3 x e4m3 -> float32, unit
scales, use_fast_accum=True: the whole head_dim stays in the tensor cores' accumulator, as in the kernel's and FA3's
WGMMA chains; cuBLASLt's default promotes partial sums to float32 now and then, which is more accurate than the
kernel); s = S * softmax_scale in float32, the explicit boolean mask, m = row max, P = exp(s - m) in float32,
l = sum P (float32, unrounded P), lse = m + log l; P8 = P * 2^8 rounded to e4m3 (the kernel's exp2(s - m + 8) and
cvt.rn.satfinite); O = P8 . v8 on the same FP8 GEMM, / (2^8 l), rounded to bfloat16.

Rule (fp8_rule): max |out - ref64| <= 2 x naive's + 1e-5, and max |lse - lse64| <= 2 x naive's + 64 float32 ulps of
max(1, max |lse64|) (the float32 / MUFU ex2, lg2 floor), -inf exactly where no key is visible, nothing unwritten.
It still fails a wrong kernel: the naive's lse error is 1e-4..2e-3 at these sizes, so the bound stays below ~5e-3, and
* an lse off by log 2 (0.69), a missing or doubled softmax_scale (|s| changes by O(1): lse by >= 0.1), a descale
  product applied twice or not at all (the same size; note the v3 C ABI runs unit descales, so descale handling is
  tested by tests/cuda/test_attention_fp8_cuda.cpp with per-head descales, not here) exceed it by >= 20x;
* a mask off by one key: the causal cases with seqlen_q > seqlen_k have rows with no visible key (lse must be -inf
  exactly) and rows with one (an extra key moves lse by ~log 2); the window (100, 20) rows see 121 keys (~1/200);
* a P scale of 2^8 not undone, a V tile skipped or doubled: out moves by O(1) against a naive out error of ~0.05.
`python3 fp8_check.py` (CPU, no GPU or library needed) checks the padding/layout path of fp8_gemm against a float32
matmul, that the baseline equals the exact-float32 one on the CPU, and that the rule rejects those wrong kernels.
"""
import math

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn


def pad16(n):
    return (n + 15) // 16 * 16


def _pad_rows_cols(x8, rows, cols):
    """e4m3 [r, c] (any strides) -> contiguous e4m3 [rows, cols], zero codes (+0.0) in the padding."""
    r, c = x8.shape
    u = x8.contiguous().view(torch.uint8)
    return F.pad(u, (0, cols - c, 0, rows - r)).contiguous().view(FP8)


def fp8_gemm(a8, b8):
    """a8 [m, k], b8 [n, k] e4m3 (row i of each is one dot-product operand) -> float32 [m, n] = a8 . b8^T on the
    device's FP8 GEMM: torch._scaled_mm wants its first operand row-major, its second column-major and every dim a
    multiple of 16, so both are zero-padded to multiples of 16 (zeros add exact zeros to every dot product) and the
    second is passed as the transpose of a contiguous [n, k] (= column-major [k, n])."""
    m, k = a8.shape
    n = b8.shape[0]
    assert b8.shape[1] == k and a8.dtype == FP8 and b8.dtype == FP8
    mp, np_, kp = pad16(m), pad16(n), pad16(k)
    ap, bp = _pad_rows_cols(a8, mp, kp), _pad_rows_cols(b8, np_, kp)
    one = torch.ones((), dtype=torch.float32, device=a8.device)
    d = torch._scaled_mm(ap, bp.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
    return d[:m, :n]


def gemm_exact(a8, b8):
    """The same contract with float32 matmul of the e4m3 values (exact products, float32 sums): the stand-in on the
    CPU and the 'exact accumulation' diagnostic on the GPU (torch's default float32 matmul precision: no TF32)."""
    return a8.float() @ b8.float().t()


def gemm_truncating(a8, b8, bits=13, chunk=32):
    """A CPU model of a reduced-precision accumulator (for the self-test only: the rule's margins at a GPU-sized
    naive error): float32 dot products of `chunk` products, added to a running sum truncated toward zero to `bits`
    significant bits after every chunk (roughly one wgmma k32 step into a ~13-bit-mantissa accumulator)."""
    a, b = a8.double(), b8.double()
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for c0 in range(0, a.shape[1], chunk):
        acc = acc + a[:, c0:c0 + chunk] @ b[:, c0:c0 + chunk].t()
        mant, ex = torch.frexp(acc)
        acc = torch.ldexp(torch.trunc(mant * 2.0 ** bits) / 2.0 ** bits, ex)
    return acc.float()


def naive_fp8(q8, k8, v8, mask, softmax_scale, gemm=fp8_gemm):
    """q8 [b, sq, h, d], k8 / v8 [b, sk, hk, d] e4m3 (h a multiple of hk), mask [sq, sk] bool (True = visible) ->
    out [b, sq, h, d] bfloat16 (0 for rows without a visible key), lse [b, h, sq] float64 (natural log; -inf there)."""
    b, sq, h, d = q8.shape
    sk, hk = k8.shape[1], k8.shape[2]
    rep = h // hk
    s = torch.empty(b, h, sq, sk, dtype=torch.float32, device=q8.device)
    for bi in range(b):
        for hi in range(h):
            s[bi, hi] = gemm(q8[bi, :, hi], k8[bi, :, hi // rep])
    s = (s * softmax_scale).masked_fill(~mask, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    p = torch.nan_to_num(torch.exp(s - m), nan=0.0)  # rows with no visible key: -inf - -inf
    l = p.sum(dim=-1, keepdim=True)
    lse = (m.double() + torch.log(l.double())).squeeze(-1)  # -inf + log 0 = -inf for rows without keys
    p8 = (p * 256.0).to(FP8)
    o = torch.empty(b, h, sq, d, dtype=torch.float32, device=q8.device)
    for bi in range(b):
        for hi in range(h):
            o[bi, hi] = gemm(p8[bi, hi], v8[bi, :, hi // rep].t())
    o = torch.nan_to_num(o / (256.0 * l), nan=0.0).to(torch.bfloat16)
    return o.transpose(1, 2), lse


def lse_error(lse, ref_lse):
    """max |lse - ref| over rows with a visible key (float64), and whether -inf sits exactly where ref has it."""
    fin = torch.isfinite(ref_lse)
    inf_ok = bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)))
    err = (lse.double()[fin] - ref_lse[fin]).abs().max().item() if fin.any() else 0.0
    return err, inf_ok


def lse_floor(ref_lse):
    """64 float32 ulps of max(1, max |lse64|) (4e-6 x |lse|): the kernel's lse is float32 after a few float32
    roundings and MUFU ex2 / lg2 (relative error <= 2^-22); the naive's float64 log does not carry them."""
    fin = ref_lse[torch.isfinite(ref_lse)]
    mag = max(1.0, fin.abs().max().item()) if fin.numel() else 1.0
    return 64 * math.ldexp(mag, -24)


def fp8_rule(out, lse, ref, ref_lse, naive, naive_lse):
    """The judgement of one FP8 case: dict of the errors and ok (see the module doc)."""
    err = (out.double() - ref).abs().max().item()
    err_naive = (naive.double() - ref).abs().max().item()
    lse_err, inf_ok = lse_error(lse, ref_lse)
    lse_err_naive, naive_inf_ok = lse_error(naive_lse, ref_lse)
    floor = lse_floor(ref_lse)
    unwritten = int(torch.isnan(out).sum().item())
    ok = (unwritten == 0 and err <= 2 * err_naive + 1e-5 and inf_ok and not math.isnan(lse_err) and
          lse_err <= 2 * lse_err_naive + floor)
    return dict(err=err, err_naive=err_naive, ratio=err / max(err_naive, 1e-12), lse_err=lse_err,
                lse_err_naive=lse_err_naive, lse_ratio=lse_err / max(lse_err_naive, 1e-12), lse_floor=floor,
                lse_inf_ok=inf_ok, naive_lse_inf_ok=naive_inf_ok, unwritten=unwritten, ok=ok)


def _mask(sq, sk, window):
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    m = torch.ones(sq, sk, dtype=torch.bool)
    if window[0] >= 0:
        m &= j >= i - window[0]
    if window[1] >= 0:
        m &= j <= i + window[1]
    return m


def _ref64(q8, k8, v8, mask, scale):
    h, hk = q8.shape[2], k8.shape[2]
    qd, kd, vd = (x.double().repeat_interleave(h // x.shape[2], dim=2).transpose(1, 2) for x in (q8, k8, v8))
    s = ((qd @ kd.transpose(-1, -2)) * scale).masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    assert hk <= h
    return (p @ vd).transpose(1, 2), lse


def _strict_scaled_mm(a, b, scale_a, scale_b, out_dtype, use_fast_accum=False):
    """A float32 stand-in for torch._scaled_mm that enforces the CUDA path's operand rules, which the CPU's
    _scaled_mm does not (it takes odd dims and a row-major second operand): e4m3 operands, a row-major, b
    column-major, every dim a multiple of 16, float32 scalar scales."""
    assert a.dtype == FP8 and b.dtype == FP8 and out_dtype == torch.float32 and use_fast_accum
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]
    assert a.stride() == (a.shape[1], 1), f"first operand not row-major: {a.shape} {a.stride()}"
    assert b.stride() == (1, b.shape[0]), f"second operand not column-major: {b.shape} {b.stride()}"
    assert all(x % 16 == 0 for x in (*a.shape, b.shape[1])), f"dims not multiples of 16: {a.shape} x {b.shape}"
    assert scale_a.numel() == 1 and scale_b.numel() == 1 and scale_a.dtype == scale_b.dtype == torch.float32
    return (a.float() @ b.float()) * (scale_a * scale_b)


def selftest():
    """CPU checks of the layout path and of the rule (see the module doc); raises AssertionError on a failure."""
    real = torch._scaled_mm
    try:  # first with the strict stand-in (the CUDA operand rules), then with the CPU's own _scaled_mm
        torch._scaled_mm = _strict_scaled_mm
        _selftest("strict float32 stand-in")
    finally:
        torch._scaled_mm = real
    try:  # older CPU builds have no e4m3 _scaled_mm: the stand-in pass above still checked the layout
        fp8_gemm(torch.zeros(16, 16).to(FP8), torch.zeros(16, 16).to(FP8))
    except RuntimeError as e:
        print(f"fp8_check selftest: no CPU torch._scaled_mm for e4m3 here ({str(e)[:80]}); that pass skipped")
    else:
        _selftest("CPU torch._scaled_mm")
    print("fp8_check selftest: ok")


def _selftest(gemm_name):
    print(f"fp8_check selftest, FP8 GEMM = {gemm_name}")
    g = torch.Generator().manual_seed(1234)
    # 1. fp8_gemm (padding, column-major second operand, strided inputs) = float32 matmul of the e4m3 values
    for m, n, k in ((1, 517, 64), (203, 113, 128), (37, 45, 256), (32, 48, 16)):
        a = torch.randn(m, 3, k, generator=g).to(FP8)[:, 1]  # strided rows, as q8[b, :, h]
        b = torch.randn(n, k, generator=g).to(FP8)
        got = fp8_gemm(a, b)
        want = a.double() @ b.double().t()
        assert got.shape == (m, n) and got.dtype == torch.float32
        tol = 1e-5 * (a.double().abs() @ b.double().abs().t()).max().item()
        assert (got.double() - want).abs().max().item() <= tol, (m, n, k)
        vt = torch.randn(k, 2, n, generator=g).to(FP8)[:, 0]  # V [sk, d] strided, passed transposed as in naive_fp8
        got = fp8_gemm(a, vt.t())
        assert (got.double() - a.double() @ vt.double()).abs().max().item() <= tol, ("pv", m, n, k)
    # 2. the baseline on the CPU's _scaled_mm equals the exact-float32 one; the rule passes it and fails wrong kernels
    for (b, sq, sk, h, hk, d), window in (((2, 203, 113, 4, 2, 64), (-1, 0)), ((1, 70, 90, 2, 1, 128), (10, 3)),
                                          ((1, 1, 40, 2, 1, 256), (-1, -1))):
        q8, k8, v8 = (torch.randn(b, s_, hh, d, generator=g).to(FP8) for s_, hh in ((sq, h), (sk, hk), (sk, hk)))
        mask, scale = _mask(sq, sk, window), 1 / math.sqrt(d)
        ref, ref_lse = _ref64(q8, k8, v8, mask, scale)
        naive, naive_lse = naive_fp8(q8, k8, v8, mask, scale)
        ex, ex_lse = naive_fp8(q8, k8, v8, mask, scale, gemm=gemm_exact)
        tr, tr_lse = naive_fp8(q8, k8, v8, mask, scale, gemm=gemm_truncating)
        assert (naive.float() - ex.float()).abs().max().item() <= 0.02  # bf16 rounding of a float32 sum-order change
        assert (naive_lse - ex_lse).nan_to_num(0.0).abs().max().item() <= 1e-5
        assert not torch.isnan(naive_lse).any() and torch.isfinite(ref_lse).any()
        # the baseline itself is attention: within e4m3 P rounding (2^-4 relative) + bf16 of float64, lse within 1e-5
        assert (naive.double() - ref).abs().max().item() <= 0.1 and fp8_rule(
            naive, naive_lse, ref, ref_lse, naive, naive_lse)["lse_err"] <= 1e-5
        # a 'kernel' with the baseline's arithmetic passes (ratio 1)
        r = fp8_rule(naive, naive_lse.float(), ref, ref_lse, naive, naive_lse)
        assert r["ok"], r
        bad = {
            "lse + log 2": (naive, naive_lse.float() + math.log(2)),
            "softmax_scale missing": naive_fp8(q8, k8, v8, mask, 1.0),
            "softmax_scale doubled": naive_fp8(q8, k8, v8, mask, 2 * scale),
            "out x 256 (P scale not undone)": (naive.float() * 256, naive_lse),
            "a NaN left in out": (naive.float().index_fill(1, torch.tensor([0]), float("nan")), naive_lse),
        }
        if window != (-1, -1):  # the mask one key wider on each bounded side
            wider = (window[0] + 1 if window[0] >= 0 else -1, window[1] + 1)
            bad["mask off by one key"] = naive_fp8(q8, k8, v8, _mask(sq, sk, wider), scale)
        # the same wrong kernels against the exact baseline and against one with a GPU-sized lse error (truncating
        # accumulator model: naive lse error 1e-4..1e-3 as on the H200): rejected by both
        rt = fp8_rule(naive, naive_lse.float(), ref, ref_lse, tr, tr_lse)
        assert rt["ok"] and rt["lse_err_naive"] > 1e-5, rt
        for what, (o, ls) in bad.items():
            for base, base_lse in ((naive, naive_lse), (tr, tr_lse)):
                r = fp8_rule(o, ls.float(), ref, ref_lse, base, base_lse)
                assert not r["ok"], (what, r)
        print(f"  ok: case {(b, sq, sk, h, hk, d)} window {window}: naive out err {rt['err']:.3g}, lse err "
              f"{rt['lse_err']:.3g}; truncating-accumulator naive: out {rt['err_naive']:.3g}, lse "
              f"{rt['lse_err_naive']:.3g}; rejected: {', '.join(bad)}")


if __name__ == "__main__":
    selftest()
