"""Every GGUF block format flashkv reads (F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K), dequantized by
`flashkv inspect --tensor`, must equal bit for bit the values that gguf_spec.py (an independent numpy reader written
from the block definitions) computes on random blocks. Plus the loader's typed errors on bad tensors, and the real
SmolLM2 file's Q4_1 / Q8_0 / F32 tensors when it is installed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import gguf_spec as spec  # noqa: E402

CLI = os.environ.get("FLASHKV_CLI", "flashkv")
# flashkv::fetched_models_dir(): $FLASHKV_MODEL_HOME when set and not empty, else <source>/models (scripts/setup)
MODEL_HOME = os.environ.get("FLASHKV_MODEL_HOME") or os.path.join(os.path.dirname(__file__), "..", "..", "models")
SMOLLM2 = os.path.join(MODEL_HOME, "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
SEED = int(os.environ.get("FLASHKV_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))
print(f"[flashkv] FLASHKV_TEST_SEED={SEED}")
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
META = [("general.architecture", 8, "test"), ("general.alignment", 4, 32)]


def run_cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def dump(path, name, tmp_path):
    out = tmp_path / (name + ".f32")
    p = run_cli("inspect", "--model", str(path), "--tensor", name, "--out", str(out))
    assert p.returncode == 0, p.stderr
    return np.fromfile(out, dtype="<f4")


@pytest.mark.parametrize("type_name", TYPES)
def test_block_format_matches_the_spec_reader(type_name, tmp_path):
    rng = np.random.default_rng(SEED + TYPES.index(type_name))
    t = spec.TYPE_ID[type_name]
    ne = [512, 3]  # rows of 512 values: whole blocks for every format (K-quants: 2 super-blocks per row)
    n = ne[0] * ne[1]
    raw = spec.random_blocks(rng, t, n)
    path = tmp_path / "t.gguf"
    # A second tensor after the first checks that offsets and alignment are honoured.
    raw2 = spec.random_blocks(rng, t, 256)
    spec.write_gguf(path, META, [("a", ne, t, raw), ("b", [256], t, raw2)])
    for name, data, count in (("a", raw, n), ("b", raw2, 256)):
        want = spec.dequantize(t, np.frombuffer(data, np.uint8), count)
        got = dump(path, name, tmp_path)
        assert got.shape == want.shape
        assert np.all(np.isfinite(want))
        bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert bad.size == 0, f"{type_name}: {bad.size} values differ, first at {bad[:5]}: {got[bad[:5]]} vs {want[bad[:5]]}"
        if type_name not in ("F32", "F16", "BF16"):
            assert np.unique(want).size > 32, "random blocks give many distinct values (the test can fail)"


def test_hand_computed_blocks(tmp_path):
    """A few blocks whose values are worked out by hand from the layouts (not by the spec reader)."""
    d = np.float16(0.5).tobytes()
    m = np.float16(-1.0).tobytes()
    qs = bytes([0x21] + [0x00] * 15)  # value 0 = 1 (low nibble), value 16 = 2 (high nibble), others 0
    blocks = {
        "Q4_0": (d + qs, {0: 0.5 * (1 - 8), 16: 0.5 * (2 - 8), 1: 0.5 * -8}),
        "Q4_1": (d + m + qs, {0: 0.5 * 1 - 1, 16: 0.5 * 2 - 1, 1: -1.0}),
        # qh bit 0 set → value 0 = 1 | 16 = 17; bit 16 set → value 16 = 2 | 16 = 18
        "Q5_0": (d + (1 | 1 << 16).to_bytes(4, "little") + qs, {0: 0.5 * (17 - 16), 16: 0.5 * (18 - 16), 1: 0.5 * -16}),
        "Q5_1": (d + m + (1 | 1 << 16).to_bytes(4, "little") + qs, {0: 0.5 * 17 - 1, 16: 0.5 * 18 - 1, 2: -1.0}),
        "Q8_0": (d + bytes([0x7F, 0x80] + [0x01] * 30), {0: 0.5 * 127, 1: 0.5 * -128, 2: 0.5}),
    }
    # Q4_K: d = 0.5, dmin = 0.25; sub-block 0: scale 3, min 2; sub-block 5 (j >= 4 path): scale = (b[9] & 15) | (b[1] >> 6) << 4
    sc = bytearray(12)
    sc[0], sc[4] = 3, 2
    sc[9] = 0x35  # scale5 low bits 5, min5 low bits 3
    sc[1] = 0x40  # scale5 high bits 1 → scale5 = 5 | 16 = 21
    sc[5] = 0x80  # min5 high bits 2 → min5 = 3 | 32 = 35
    q4k = np.float16(0.5).tobytes() + np.float16(0.25).tobytes() + bytes(sc)
    qs = bytearray(128)
    qs[0] = 0x07        # value 0 (sub-block 0) = 7; value 32 (sub-block 1) = 0
    qs[64 + 1] = 0x90   # chunk 2: value 129 (sub-block 4, low) = 0, value 161 (sub-block 5, high) = 9
    blocks["Q4_K"] = (q4k + bytes(qs), {0: 0.5 * 3 * 7 - 0.25 * 2, 161: 0.5 * 21 * 9 - 0.25 * 35, 129: 0.0})
    # Q6_K: d = 0.25, scale[0] = 2, scale[2] = -3; value 0: ql low 5 | (qh & 3 = 1) << 4 = 21 → 21-32; value 32: ql[32] low
    # nibble 0 | ((qh[0] >> 2) & 3 = 2) << 4 = 32 → 0
    ql, qh = bytearray(128), bytearray(64)
    ql[0] = 0x05
    qh[0] = 0x01 | 0x02 << 2
    scales = bytearray(16)
    scales[0], scales[2] = 2, (256 - 3)
    blocks["Q6_K"] = (bytes(ql) + bytes(qh) + bytes(scales) + np.float16(0.25).tobytes(),
                      {0: 0.25 * 2 * (21 - 32), 32: 0.0, 1: 0.25 * 2 * -32, 40: 0.25 * -3 * -32})
    for type_name, (raw, expect) in blocks.items():
        t = spec.TYPE_ID[type_name]
        bv = spec.GGML[t][1]
        path = tmp_path / f"{type_name}.gguf"
        spec.write_gguf(path, META, [("x", [bv], t, raw)])
        got = dump(path, "x", tmp_path)
        for i, v in expect.items():
            assert got[i] == np.float32(v), (type_name, i, got[i], v)
        assert np.array_equal(got, spec.dequantize(t, np.frombuffer(raw, np.uint8), bv)), type_name


def error_line(p):
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    return lines[0]


def test_truncated_tensor_names_the_tensor(tmp_path):
    rng = np.random.default_rng(SEED)
    raw = spec.random_blocks(rng, spec.TYPE_ID["Q4_K"], 512)
    path = tmp_path / "t.gguf"
    spec.write_gguf(path, META, [("blk.7.attn_q.weight", [512], spec.TYPE_ID["Q4_K"], raw)])
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    msg = error_line(run_cli("inspect", "--model", str(path)))
    assert "blk.7.attn_q.weight" in msg and "past the end" in msg


def test_unsupported_type_and_bad_row_length_name_the_tensor(tmp_path):
    path = tmp_path / "t.gguf"
    spec.write_gguf(path, META, [("w", [256], 10, bytes(84))])  # Q2_K
    msg = error_line(run_cli("inspect", "--model", str(path), "--tensor", "w", "--out", str(tmp_path / "o")))
    assert "'w'" in msg and "Q2_K" in msg and "supported" in msg
    spec.write_gguf(path, META, [("v", [48], spec.TYPE_ID["Q8_0"], bytes(34 * 2))])
    msg = error_line(run_cli("inspect", "--model", str(path)))
    assert "'v'" in msg and "multiple of its block size 32" in msg


def test_non_finite_scale_is_rejected(tmp_path):
    raw = bytearray(spec.random_blocks(np.random.default_rng(SEED), spec.TYPE_ID["Q8_0"], 64))
    raw[34:36] = np.float16(np.inf).tobytes()  # second block's scale
    path = tmp_path / "t.gguf"
    spec.write_gguf(path, META, [("emb", [64], spec.TYPE_ID["Q8_0"], bytes(raw))])
    msg = error_line(run_cli("inspect", "--model", str(path), "--tensor", "emb", "--out", str(tmp_path / "o")))
    assert "'emb'" in msg and "non-finite" in msg and "block 1" in msg


@pytest.mark.skipif(not os.path.exists(SMOLLM2), reason=f"SmolLM2 not installed ({SMOLLM2}): run scripts/setup")
@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                  "output_norm.weight"])
def test_smollm2_tensors_match_the_spec_reader(name, tmp_path):
    g = spec.GGUF(SMOLLM2)
    want = g.tensor(name).reshape(-1)
    got = dump(SMOLLM2, name, tmp_path)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def byte_alphabet():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cps, n = {}, 0
    for b in range(256):
        if b in keep:
            cps[b] = b
        else:
            cps[b] = 256 + n
            n += 1
    return [chr(cps[b]) for b in range(256)]


def test_tiny_llama_with_every_block_format_matches_the_float64_reference(tmp_path):
    """A random 2-layer llama GGUF whose matrices use every quantized format (and an untied BF16 classifier):
    flashkv's greedy logits match reference_gguf.py (float64, from the same file) to float32 rounding."""
    import reference_gguf
    rng = np.random.default_rng(SEED)
    dim, hidden, heads, kv, layers, ctx = 256, 512, 4, 2, 2, 64
    tokens = byte_alphabet() + ["ab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * 257 + [3, 3, 3]
    vocab = len(tokens)
    meta = [("general.architecture", 8, "llama"), ("general.alignment", 4, 32),
            ("llama.context_length", 4, ctx), ("llama.embedding_length", 4, dim), ("llama.block_count", 4, layers),
            ("llama.feed_forward_length", 4, hidden), ("llama.attention.head_count", 4, heads),
            ("llama.attention.head_count_kv", 4, kv), ("llama.rope.freq_base", 6, 10000.0),
            ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5), ("tokenizer.ggml.model", 8, "gpt2"),
            ("tokenizer.ggml.pre", 8, "smollm"), ("tokenizer.ggml.tokens", 9, (8, tokens)),
            ("tokenizer.ggml.token_type", 9, (5, types)), ("tokenizer.ggml.merges", 9, (8, ["a b"])),
            ("tokenizer.ggml.eos_token_id", 4, vocab - 1), ("tokenizer.ggml.add_bos_token", 7, False)]
    T = spec.TYPE_ID
    mats = {"attn_q": ([dim, dim], ["Q4_0", "Q8_0"]), "attn_k": ([dim, 128], ["Q4_1", "Q4_K"]),
            "attn_v": ([dim, 128], ["Q5_0", "Q5_K"]), "attn_output": ([dim, dim], ["Q5_1", "Q6_K"]),
            "ffn_gate": ([dim, hidden], ["Q4_K", "Q4_0"]), "ffn_up": ([dim, hidden], ["Q5_K", "Q5_1"]),
            "ffn_down": ([hidden, dim], ["Q6_K", "F16"])}
    tensors = [("token_embd.weight", [dim, vocab], T["F16"], spec.random_blocks(rng, T["F16"], dim * vocab))]
    for l in range(layers):
        norm = (1 + 0.1 * rng.standard_normal(dim)).astype("<f4").tobytes()
        tensors.append((f"blk.{l}.attn_norm.weight", [dim], 0, norm))
        tensors.append((f"blk.{l}.ffn_norm.weight", [dim], 0, norm))
        for name, (ne, ts) in mats.items():
            t = T[ts[l]]
            tensors.append((f"blk.{l}.{name}.weight", ne, t, spec.random_blocks(rng, t, ne[0] * ne[1], scale=0.1)))
    tensors.append(("output_norm.weight", [dim], 0, np.ones(dim, "<f4").tobytes()))
    tensors.append(("output.weight", [dim, vocab], T["BF16"], spec.random_blocks(rng, T["BF16"], dim * vocab)))
    path = tmp_path / "tiny.gguf"
    spec.write_gguf(path, meta, tensors)
    logits_path = tmp_path / "logits.f32"
    p = run_cli("generate", "--model", str(path), "--prompt", "abc ab 12", "--temperature", "0", "--steps", "12",
                "--ignore-eos", "--json", "--logits-out", str(logits_path))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    fl = np.fromfile(logits_path, "<f4").reshape(len(out["tokens"]), vocab)
    model = reference_gguf.Model(str(path))
    seq = out["prompt_tokens"] + out["tokens"]
    P = len(out["prompt_tokens"])
    rl = model.logits(seq[:-1], list(range(P - 1, len(seq) - 1)))
    diff = np.abs(fl - rl).max(axis=1)
    scale = np.abs(rl).max()
    assert diff.max() < 1e-5 * max(1.0, scale) * 10, (diff.max(), scale)
    for i, tok in enumerate(out["tokens"]):
        top = int(rl[i].argmax())
        assert tok == top or rl[i, top] - rl[i, tok] <= 2 * diff[i], (i, tok, top)
