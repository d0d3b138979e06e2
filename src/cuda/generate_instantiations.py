#!/usr/bin/env python3
"""Writes one small .cu per (kernel kind, head_dim, dtype, arch) instantiation of the CUDA backend, named for all four
(fwd_hdim128_bf16_sm90.cu, fwd_hdim128_bf16_sm90ws.cu), plus kernel_table.cu that lists them with their arch (src/cuda/kernels.hpp). Each file
includes only its own family's launcher. Run by CMake at configure time into the build tree; files are rewritten only
when their content changes, so re-configuring does not trigger rebuilds.

  python3 generate_instantiations.py --out DIR --head-dims 64,128 --dtypes bf16,fp16 [--kinds fwd,bwd,decode,fwd_v1]
                                    [--kv-formats fp8_e4m3,fp8_e4m3_dynamic,int8,int4,int8/int4]
                                    [--fp8-head-dims 128]

Prints the generated .cu paths (one per line) for CMake.

With the decode kind, every --kv-formats entry (a kv_cache_dtype for both halves, or K/V as "KFMT/VFMT") is also
compiled as a quantized decode (decode_quant_hdim128_bf16_int8_sm80.cu: run_decode_quant over the entry's KVCode x
KVScaling per half, src/cuda/sm80/decode_kv_source.cuh), listed in decode_quant_table.cu (src/cuda/decode_quant.hpp);
the group size is a run-time parameter, so int4 covers int4_g32..int4_g256. A combination that is not listed is an
UnsupportedError naming it. A new token-granular format is one line in KV_FORMATS.

--fp8-head-dims compiles the FP8 (float8_e4m3fn q/k/v, bfloat16 out) forward of the sm90ws family for those head dims
(fwd_hdim128_e4m3_sm90ws.cu: run_fwd_sm90ws<128, __nv_fp8_e4m3>, FP8_HEAD_DIMS); FP8 has no other kind or family.

A new head dim is one line in HEAD_DIMS (the families it is compiled for; tile sizes come from the default rule of
src/cuda/common/tile_size.hpp unless that file has a tuned entry for it).
"""
import argparse
import os
import sys

# head_dim: families whose fwd/bwd kernels are compiled for it (fwd_v1 and decode exist as sm80 only; a family
# without a launcher for a kind, e.g. sm90ws for bwd, is skipped).
# sm90ws (TMA warp-specialized, forward only) needs head dims that are multiples of 64 (common/tile_size.hpp).
HEAD_DIMS = {
    64: ("sm80", "sm90", "sm90ws"),
    96: ("sm80",),
    128: ("sm80", "sm90", "sm90ws"),
    192: ("sm80",),
    256: ("sm80", "sm90", "sm90ws"),
}
DTYPES = {"bf16": ("__nv_bfloat16", "DType::bfloat16"), "fp16": ("__half", "DType::float16")}
# The FP8 forward (sm90ws only): its head dims, C++ type and shared-memory function.
FP8_HEAD_DIMS = (64, 128, 256)
FP8_DTYPE = ("e4m3", "__nv_fp8_e4m3", "DType::float8_e4m3fn")
# kind: KernelKind enumerator, params type, and per arch (launcher, header, shared-memory function or None)
KINDS = {
    "fwd": ("fwd", "FwdParams", {
        "sm80": ("run_fwd_sm80", "cuda/sm80/fwd_launch.cuh", None),
        "sm90": ("run_fwd_sm90", "cuda/sm90/fwd_launch.cuh", "fwd_smem_bytes_sm90"),
        "sm90ws": ("run_fwd_sm90ws", "cuda/sm90/fwd_tma_ws_launch.cuh", "fwd_smem_bytes_sm90ws"),
    }),
    "bwd": ("bwd", "BwdParams", {
        "sm80": ("run_bwd_sm80", "cuda/sm80/bwd_launch.cuh", None),
        "sm90": ("run_bwd_sm90", "cuda/sm90/bwd_launch.cuh", "bwd_smem_bytes_sm90"),
    }),
    "decode": ("decode", "DecodeParams", {"sm80": ("run_decode", "cuda/sm80/decode_launch.cuh", None)}),
    "fwd_v1": ("fwd_v1", "FwdParams", {"sm80": ("run_fwd_v1", "cuda/sm80/fwd_v1_launch.cuh", None)}),
}
# kv_cache_dtype -> (KVCode, KVScaling) of one half (token-granular formats; KIVI keys are per channel over G tokens
# and have no quantized CUDA decode yet).
KV_FORMATS = {
    "fp8_e4m3": ("e4m3", "head_static"),
    "fp8_e4m3_dynamic": ("e4m3", "token_f32"),
    "fp8_e5m2": ("e5m2", "head_static"),
    "fp8_e5m2_dynamic": ("e5m2", "token_f32"),
    "int8": ("u8", "token_affine"),
    "int4": ("u4", "token_affine"),
}
# What each launcher returns (decode's launcher reports nothing).
RETURNS = {"decode": "void"}


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--kv-formats", default="")
    ap.add_argument("--fp8-head-dims", default="")
    a = ap.parse_args()
    fp8_dims = sorted({int(x) for x in a.fp8_head_dims.replace(";", ",").split(",") if x})
    for d in fp8_dims:
        if d not in FP8_HEAD_DIMS:
            sys.exit(f"generate_instantiations.py: FP8 head dim {d} is not one of {list(FP8_HEAD_DIMS)}")
    head_dims = sorted({int(x) for x in a.head_dims.replace(";", ",").split(",") if x})
    dtypes = [x for x in a.dtypes.replace(";", ",").split(",") if x]
    kinds = [x for x in a.kinds.replace(";", ",").split(",") if x]
    for d in head_dims:
        if d not in HEAD_DIMS:
            sys.exit(f"generate_instantiations.py: head dim {d} is not one of {sorted(HEAD_DIMS)}")
    for t in dtypes:
        if t not in DTYPES:
            sys.exit(f"generate_instantiations.py: dtype {t} is not one of {list(DTYPES)}")
    for k in kinds:
        if k not in KINDS:
            sys.exit(f"generate_instantiations.py: kind {k} is not one of {list(KINDS)}")
    os.makedirs(a.out, exist_ok=True)
    files, entries, decls = [], [], []
    for kind in kinds:
        enum, params, archs = KINDS[kind]
        ret = RETURNS.get(kind, "LaunchInfo")
        for arch, (fn, header, smem_fn) in archs.items():
            combos = [(d, t, DTYPES[t][0], DTYPES[t][1], smem_fn) for d in head_dims for t in dtypes
                      if arch in HEAD_DIMS[d] or kind not in ("fwd", "bwd")]
            if kind == "fwd" and arch == "sm90ws":
                combos += [(d, FP8_DTYPE[0], FP8_DTYPE[1], FP8_DTYPE[2], smem_fn + "_fp8") for d in fp8_dims]
            for d, t, ctype, dtype_enum, sfn in combos:
                name = f"{kind}_hdim{d}_{t}_{arch}.cu"
                text = (f"// Generated by src/cuda/generate_instantiations.py; do not edit.\n"
                        f'#include "{header}"\n\n'
                        f"template {ret if ret == 'void' else 'flashkv::cuda::' + ret} flashkv::cuda::{fn}<{d}, {ctype}>("
                        f"const flashkv::cuda::{params}&, cudaStream_t);\n")
                if sfn:
                    text += f"template int flashkv::cuda::{sfn}<{d}>();\n"
                path = os.path.join(a.out, name)
                write_if_changed(path, text)
                files.append(path)
                decls.append(f"template <int D, class T> {ret} {fn}(const {params}&, cudaStream_t);\n"
                             f"extern template {ret} {fn}<{d}, {ctype}>(const {params}&, cudaStream_t);")
                smem = "nullptr"
                if sfn:
                    decls.append(f"template <int D> int {sfn}();\nextern template int {sfn}<{d}>();")
                    smem = f"&{sfn}<{d}>"
                entries.append(f"    {{KernelKind::{enum}, KernelArch::{arch}, {d}, {dtype_enum}, "
                               f"reinterpret_cast<void*>(&{fn}<{d}, {ctype}>), {smem}}},")
    decls = list(dict.fromkeys(decls))
    table = ("// Generated by src/cuda/generate_instantiations.py; do not edit.\n"
             "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_fp8.h>\n\n#include \"cuda/kernels.hpp\"\n\n"
             "namespace flashkv::cuda {\n\n" + "\n".join(decls) + "\n\n"
             "const KernelEntry kKernelTable[] = {\n" + "\n".join(entries) +
             "\n    {KernelKind::fwd, KernelArch::sm80, 0, DType::float32, nullptr, nullptr},  // sentinel\n" +
             "};\nconst int kKernelTableSize = " + str(len(entries)) + ";\n\n}  // namespace flashkv::cuda\n")
    path = os.path.join(a.out, "kernel_table.cu")
    write_if_changed(path, table)
    files.append(path)
    files += quant_decode(a, head_dims, dtypes, "decode" in kinds)
    print("\n".join(files))


def quant_decode(a, head_dims, dtypes, enabled):
    """decode_quant_*.cu per (KV format pair, head_dim, dtype) and decode_quant_table.cu (always written)."""
    pairs = []
    for item in [x for x in a.kv_formats.replace(";", ",").split(",") if x] if enabled else []:
        kf, _, vf = item.partition("/")
        vf = vf or kf
        for f in (kf, vf):
            if f not in KV_FORMATS:
                sys.exit(f"generate_instantiations.py: kv format {f} is not one of {list(KV_FORMATS)}")
        pairs.append((item, kf, vf))
    files, entries, decls = [], [], []
    for item, kf, vf in pairs:
        (kc, ks), (vc, vs) = KV_FORMATS[kf], KV_FORMATS[vf]
        targs = (f"kv::KVCode::{kc}, kv::KVScaling::{ks}, kv::KVCode::{vc}, kv::KVScaling::{vs}")
        tag = kf if kf == vf else f"{kf}_{vf}"
        for d in head_dims:
            for t in dtypes:
                ctype, dtype_enum = DTYPES[t]
                name = f"decode_quant_hdim{d}_{t}_{tag}_sm80.cu"
                text = ("// Generated by src/cuda/generate_instantiations.py; do not edit.\n"
                        '#include "cuda/sm80/decode_launch.cuh"\n\n'
                        "namespace flashkv::cuda {\n"
                        f"template void run_decode_quant<{d}, {ctype}, {targs}>(const DecodeParams&, cudaStream_t);\n"
                        "}  // namespace flashkv::cuda\n")
                path = os.path.join(a.out, name)
                write_if_changed(path, text)
                files.append(path)
                decls.append(f"extern template void run_decode_quant<{d}, {ctype}, {targs}>(const DecodeParams&, "
                             "cudaStream_t);")
                entries.append(f"    {{{d}, {dtype_enum}, {targs}, &run_decode_quant<{d}, {ctype}, {targs}>, "
                               f'"{item}"}},')
    table = ("// Generated by src/cuda/generate_instantiations.py; do not edit.\n"
             "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n\n#include \"cuda/decode_quant.hpp\"\n\n"
             "namespace flashkv::cuda {\n\n"
             "template <int kHeadDim, class T, kv::KVCode KC, kv::KVScaling KS, kv::KVCode VC, kv::KVScaling VS>\n"
             "void run_decode_quant(const DecodeParams&, cudaStream_t);\n" + "\n".join(decls) + "\n\n"
             "const QuantDecodeEntry kQuantDecodeTable[] = {\n" + "\n".join(entries) +
             "\n    {0, DType::float32, kv::KVCode::f32, kv::KVScaling::none, kv::KVCode::f32, kv::KVScaling::none, "
             "nullptr, \"\"},  // sentinel\n};\nconst int kQuantDecodeTableSize = " + str(len(entries)) +
             ";\n\n}  // namespace flashkv::cuda\n")
    path = os.path.join(a.out, "decode_quant_table.cu")
    write_if_changed(path, table)
    return files + [path]


if __name__ == "__main__":
    main()
