"""The benchmark's weight equivalence (bench/gpu/hf_llama_gguf.py, issue 14): a seeded random Hugging Face
LlamaForCausalLM written as GGUF and loaded by flashkv is the SAME model — flashkv's greedy tokens and per-step logits
(`flashkv generate --device cpu --kv-cache fp32 --logits-out`, float32 weights dequantized from BF16) equal
transformers' (float32, sdpa, the same bf16-representable weights) on the same prompt, teacher-forced on flashkv's
tokens and through transformers' own generate() with its DynamicCache. Negative control: without llama.cpp's Q/K row
permutation the logits differ by orders of magnitude more. Skips when torch / transformers are missing."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import hf_llama_gguf as hg  # noqa: E402

CLI = os.environ.get("FLASHKV_CLI", "flashkv")
SEED = int(os.environ.get("FLASHKV_TEST_SEED", str(time.time_ns() % 2**31)))
STEPS = 12
print("seed", SEED)


def flashkv_generate(path, tmp_path, prompt="hello world, the quick brown fox"):
    logits = tmp_path / "logits.bin"
    r = subprocess.run([CLI, "generate", "--model", str(path), "--prompt", prompt, "--steps", str(STEPS),
                        "--temperature", "0", "--ignore-eos", "--kv-cache", "fp32", "--json", "--logits-out",
                        str(logits)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    return j["prompt_tokens"], j["tokens"], np.fromfile(logits, dtype=np.float32).reshape(STEPS, -1)


@pytest.mark.parametrize("shape", [dict(), dict(num_key_value_heads=4, tie_word_embeddings=True),
                                   dict(num_key_value_heads=1, rope_theta=500000.0)],
                         ids=["gqa-4-2", "mha-tied", "mqa-theta5e5"])
def test_flashkv_runs_the_transformers_model(tmp_path, shape):
    cfg = hg.config("tiny", **shape)
    model = hg.build_model(cfg, SEED, device="cpu", dtype=torch.float32)
    path = tmp_path / "tiny.gguf"
    hg.write_gguf(model, path)
    prompt, tokens, fk = flashkv_generate(path, tmp_path)
    assert len(tokens) == STEPS and fk.shape == (STEPS, cfg.vocab_size)
    n = len(prompt)
    with torch.no_grad():
        ids = torch.tensor([prompt + tokens])
        hf = model(ids).logits[0, n - 1:n - 1 + STEPS].double().numpy()  # row i predicts tokens[i]
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    diff = np.abs(hf - fk).max()
    scale = np.abs(hf).max()
    print(f"{shape}: max |dlogit| {diff:.3g} over logits up to {scale:.3g}")
    assert scale > 1.0  # logits of order one: a mapping error cannot hide under tiny values
    assert diff <= 2e-4 * scale
    # greedy: wherever transformers' top-2 margin exceeds 2 * the difference, flashkv's token is its argmax
    top2 = np.sort(hf, axis=1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > 2 * diff
    assert decided.sum() >= STEPS // 2
    assert all(hf[i].argmax() == tokens[i] for i in range(STEPS) if decided[i])
    # transformers' own greedy loop (DynamicCache): the same tokens up to the first undecided step
    hf_tokens = gen.sequences[0, n:].tolist()
    first_open = next((i for i in range(STEPS) if not decided[i]), STEPS)
    assert hf_tokens[:first_open] == tokens[:first_open]
    step_logits = torch.stack(gen.logits)[:, 0].double().numpy()
    assert np.abs(step_logits[:first_open] - fk[:first_open]).max() <= 2e-4 * scale

    # Negative control: the same weights without the Q/K permutation are another model.
    bad = tmp_path / "unpermuted.gguf"
    hg.write_gguf(model, bad, permute=False)
    _, _, fk_bad = flashkv_generate(bad, tmp_path)
    with torch.no_grad():
        hf0 = model(torch.tensor([prompt])).logits[0, n - 1].double().numpy()
    assert np.abs(hf0 - fk_bad[0]).max() > 100 * max(diff, 1e-6)


def test_gguf_layout_and_the_8b_shape():
    cfg = hg.config("llama3-8b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size) == (32, 4096, 32, 8, 128, 14336, 128256)
    assert hg.rope_theta(cfg) == 500000.0
    # 8.03e9 parameters (Meta-Llama-3-8B's model card) = the matrices a decode step reads (projections + classifier)
    # + the input embedding (of which a step reads only its tokens' rows) + the norms
    assert abs(hg.weight_bytes_bf16(cfg) / 2 + 128256 * 4096 - 8.03e9) < 0.01e9
    # the permutation is a per-head rotate-half -> interleaved reordering: row 2i <- i, 2i + 1 <- i + d/2
    w = torch.arange(2 * 8, dtype=torch.float32)[:, None].repeat(1, 3)
    p = hg.permute_rows(w, 2)
    assert p[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
