"""Exactness: with a float32 KV cache and greedy sampling, `flashkv generate` reproduces token for token the
independent numpy implementation (reference_llama.py) on the shipped model — from BOS, from a prompt, and after
`flashkv convert --to gguf`. Also checks CLI error handling (one line, exit code 2)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import reference_llama as ref  # noqa: E402
import shipped_model  # noqa: E402

CLI = os.environ.get("FLASHKV_CLI", "flashkv")
MODEL, TOK = str(shipped_model.MODEL), str(shipped_model.TOKENIZER)
pytestmark = pytest.mark.skipif(not shipped_model.PRESENT, reason=shipped_model.MISSING_REASON)
PROMPTS = ["", "The machine dreams of", "Echoes of light"]


def run_cli(*args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def generate(model, prompt, *extra, tokenizer=TOK):
    args = ["generate", "--model", model, "--prompt", prompt, "--temperature", "0", "--steps", "200", "--json",
            "--kv-cache", "fp32", *extra]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def checkpoint():
    return ref.Checkpoint(MODEL)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return ref.Tokenizer(TOK, checkpoint.vocab)


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gguf") / "model.gguf")
    p = run_cli("convert", "--model", MODEL, "--tokenizer", TOK, "--to", "gguf", "--type", "f32", "-o", out)
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_numpy_reference(checkpoint, tokenizer, prompt):
    prompt_tokens = tokenizer.encode(prompt)
    expected = ref.greedy(checkpoint, prompt_tokens, steps=200)
    got = generate(MODEL, prompt)
    assert got["prompt_tokens"] == prompt_tokens
    assert got["tokens"] == expected
    assert len(expected) > 20  # a real text, not an immediate stop


def test_from_bos_text_is_the_documented_one(checkpoint):
    got = generate(MODEL, "")
    assert got["text"].startswith('"Echoes of vectors unfold')


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_gguf_conversion_generates_the_same_tokens(checkpoint, tokenizer, gguf_path, prompt):
    expected = ref.greedy(checkpoint, tokenizer.encode(prompt), steps=200)
    got = generate(gguf_path, prompt, tokenizer=None)  # embedded vocabulary
    assert got["model_format"] == "gguf"
    assert got["tokens"] == expected


def test_batch_size_and_prefill_path_do_not_change_greedy_tokens(checkpoint, tokenizer):
    # bf16 cache must still start like fp32 for a few tokens (sanity), and --kv-k/--kv-v fp32 equals --kv-cache fp32.
    a = generate(MODEL, "Echoes of light")
    p = run_cli("generate", "--model", MODEL, "--tokenizer", TOK, "--prompt", "Echoes of light", "--temperature", "0",
                "--steps", "200", "--json", "--kv-k", "fp32", "--kv-v", "fp32")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"] == a["tokens"]


@pytest.mark.parametrize("args,needle", [
    (["--kv-cache", "int3"], "kv_cache_dtype"),
    (["--steps", "0"], "steps"),
    (["--steps", "-4"], "steps"),
    (["--prompt", "dream " * 200], "prompt"),
    (["--kv-k", "int8"], "kv-k"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "top_p"),
    (["--rotate", "spin"], "rotate"),
])
def test_generate_errors_are_one_line_exit_2(args, needle):
    p = run_cli("generate", "--model", MODEL, "--tokenizer", TOK, *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr


@pytest.mark.parametrize("model", ["/nonexistent/model.bin", TOK])
def test_missing_or_corrupt_model_exit_2(model):
    p = run_cli("generate", "--model", model, "--tokenizer", TOK)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_tokenizer_vocab_mismatch_exit_2(tmp_path):
    bad = tmp_path / "tok.bin"
    bad.write_bytes(open(TOK, "rb").read()[:-10])
    p = run_cli("generate", "--model", MODEL, "--tokenizer", str(bad))
    assert p.returncode == 2 and "truncated" in p.stderr


def read_gguf(path):
    """Minimal GGUF v3 reader written from the format specification (independent of flashkv's reader)."""
    import struct
    import numpy as np
    raw = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, raw, off)
        off += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal off
        n = take("Q")
        s = raw[off:off + n].decode("utf-8")
        off += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert raw[:4] == b"GGUF"
    off = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = {}
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        infos[name] = (ne, take("I"), take("Q"))
    align = meta.get("general.alignment", 32)
    start = (off + align - 1) // align * align
    tensors = {}
    for name, (ne, t, o) in infos.items():
        assert t == 0, "test converts with --type f32"
        n = int(np.prod(ne))
        tensors[name] = np.frombuffer(raw, np.float32, n, start + o).reshape(list(reversed(ne)))
    return version, meta, tensors


def test_gguf_layout_matches_the_spec_and_the_checkpoint(checkpoint, tokenizer, gguf_path):
    import numpy as np
    version, meta, t = read_gguf(gguf_path)
    assert version == 3
    assert meta["general.architecture"] == "llama"
    assert meta["llama.embedding_length"] == checkpoint.dim
    assert meta["llama.feed_forward_length"] == checkpoint.hidden
    assert meta["llama.block_count"] == checkpoint.n_layers
    assert meta["llama.attention.head_count"] == checkpoint.n_heads
    assert meta["llama.attention.head_count_kv"] == checkpoint.n_kv
    assert meta["llama.context_length"] == checkpoint.seq_len
    assert meta["tokenizer.ggml.model"] == "llama"
    pieces = [p.decode("utf-8", "replace") for p in tokenizer.pieces]
    assert [s.replace("\u2581", " ") for s in meta["tokenizer.ggml.tokens"]] == pieces
    assert meta["tokenizer.ggml.bos_token_id"] == 1 and meta["tokenizer.ggml.eos_token_id"] == 2
    # ggml ne = [in, out] → numpy shape [out, in]: identical to the llama2.c row-major weights.
    assert np.array_equal(t["token_embd.weight"], checkpoint.emb)
    assert "output.weight" not in t  # shared classifier
    for l in range(checkpoint.n_layers):
        b = f"blk.{l}."
        for name, w in [("attn_q", checkpoint.wq), ("attn_k", checkpoint.wk), ("attn_v", checkpoint.wv),
                        ("attn_output", checkpoint.wo), ("ffn_gate", checkpoint.w1), ("ffn_down", checkpoint.w2),
                        ("ffn_up", checkpoint.w3)]:
            assert np.array_equal(t[b + name + ".weight"], w[l]), name
        assert np.array_equal(t[b + "attn_norm.weight"], checkpoint.rms_att[l])
        assert np.array_equal(t[b + "ffn_norm.weight"], checkpoint.rms_ffn[l])
    assert np.array_equal(t["output_norm.weight"], checkpoint.rms_final)


def test_named_model_aidreams260k_is_the_shipped_files(checkpoint, tokenizer):
    p = run_cli("generate", "--model", "aidreams260k", "--prompt", "Echoes of light", "--temperature", "0", "--steps",
                "200", "--json", "--kv-cache", "fp32")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"] == ref.greedy(checkpoint, tokenizer.encode("Echoes of light"), steps=200)
