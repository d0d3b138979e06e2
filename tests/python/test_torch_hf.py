"""flashkv.torch with Hugging Face transformers on the CPU: attn_implementation="flashkv" and PagedCache.

A tiny LlamaForCausalLM (GQA, 3 layers, head_dim 32) is built from a config with seeded random weights:
* registration works in either import order, and AutoModelForCausalLM.from_pretrained(dir, attn_implementation=
  "flashkv") loads it;
* greedy generate with "flashkv" + PagedCache equals "sdpa" + its default DynamicCache token for token: exactly in
  float32 (PagedCache "fp32"); in bfloat16 (PagedCache "bf16") up to the first step where sdpa's own choice is a tie
  at bf16 resolution (sdpa and eager disagree there too), and the bf16 logits' error vs the float32 evaluation of the
  same weights is <= 2x sdpa's (the low-precision rule);
* a left-padded batch gives each row the tokens it gets alone (padding never enters the cache);
* quantized caches: attention from the packed pages equals sdpa on the dequantized K/V (kernel error, separated from
  quantization error), and the quantization error (teacher-forced KL, top-1 vs the unquantized cache) orders
  bf16 < int8 < int4 < int2_kivi, with the residual window lowering it;
* a training step (loss.backward) with "flashkv" gives sdpa's loss and gradients, also with a padding mask and with
  packed sequences (position_ids);
* errors: dropout in training, a cache built from another config, missing max_cache_len.
Skipped (with the reason) without torch or transformers. Seeds: conftest.py.
"""
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it for the CI)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup installs it)")

import flashkv  # noqa: E402
import flashkv.torch as ft  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

PY = Path(__file__).resolve().parents[2] / "python"


def tiny_llama(rng, dtype=torch.float32, **over):
    torch.manual_seed(int(rng.integers(1 << 31)))
    cfg = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1, attn_implementation="sdpa")
    cfg.update(over)
    return LlamaForCausalLM(LlamaConfig(**cfg)).to(dtype).eval()


def prompts(rng, batch=3, length=20, pads=(0, 5, 11)):
    ids = torch.from_numpy(rng.integers(0, 256, (batch, length)))
    mask = torch.ones_like(ids)
    for b, p in enumerate(pads[:batch]):
        mask[b, :p] = 0
    return ids, mask


def generate(model, impl, ids, mask, cache=None, n=16):
    model.set_attn_implementation(impl)
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, past_key_values=cache,
                          output_scores=True, return_dict_in_generate=True)


# ---- registration ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["flashkv_first", "transformers_first"])
def test_registration_in_either_import_order(order, tmp_path):
    imports = ["import flashkv.torch", "from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM"]
    if order == "transformers_first":
        imports.reverse()
    code = "\n".join(imports + [
        "import torch",
        "torch.manual_seed(0)",
        "cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,",
        "                  num_attention_heads=2, num_key_value_heads=1)",
        f"LlamaForCausalLM(cfg).save_pretrained({str(tmp_path)!r})",
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, attn_implementation='flashkv')",
        "assert m.config._attn_implementation == 'flashkv'",
        "out = m.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)",
        "assert flashkv.last_kernel_path().startswith('attention_forward cpu'), flashkv.last_kernel_path()",
        "print(out.shape[1])",
    ])
    env = {**__import__("os").environ, "PYTHONPATH": str(PY)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "6"


# ---- greedy generate equals sdpa ---------------------------------------------------------------------------------------


def test_generate_float32_equals_sdpa_token_for_token(rng):
    model = tiny_llama(rng)
    ids, mask = prompts(rng)
    ref = generate(model, "sdpa", ids, mask).sequences
    dense = generate(model, "flashkv", ids, mask).sequences  # flashkv attention + transformers' DynamicCache
    cache = ft.PagedCache(model.config, kv_cache_dtype="fp32", max_cache_len=64)
    paged = generate(model, "flashkv", ids, mask, cache).sequences
    assert torch.equal(dense, ref) and torch.equal(paged, ref), (ref[:, 20:], dense[:, 20:], paged[:, 20:])
    assert cache.get_seq_length() == ids.shape[1] + 15  # positions (padding included) of the prompt + 15 fed back


def test_mask_without_padding_takes_the_dense_call(rng):
    """The attention function given an all-ones 2D mask (transformers strips such masks itself in generate; direct
    callers may not) returns the no-mask result through the dense call, not the varlen gather/scatter."""
    from flashkv.torch.hf import flashkv_attention_forward

    q, k, v = (torch.from_numpy(rng.standard_normal((2, h, 12, 32))).float() for h in (4, 2, 2))
    module = torch.nn.Module()
    module.is_causal = True
    none, _ = flashkv_attention_forward(module, q, k, v, None)
    ones, _ = flashkv_attention_forward(module, q, k, v, torch.ones(2, 12, dtype=torch.int64))
    path = flashkv.last_kernel_path()
    padded_mask = torch.ones(2, 12, dtype=torch.int64)
    padded_mask[1, :3] = 0
    flashkv_attention_forward(module, q, k, v, padded_mask)
    padded_path = flashkv.last_kernel_path()
    assert torch.equal(ones, none)
    assert "varlen" not in path and "varlen" in padded_path, (path, padded_path)


def test_generate_bfloat16_equals_sdpa_up_to_bf16_ties(rng):
    """Token for token until the first step where the two picks are a tie within bf16 noise: the float32 evaluation of
    the same weights on the common prefix separates them by at most 2x sdpa's own bf16 logit error there (sdpa and
    eager disagree at such steps too)."""
    model = tiny_llama(rng, torch.bfloat16)
    ids, mask = prompts(rng)
    ref = generate(model, "sdpa", ids, mask)
    got = generate(model, "flashkv", ids, mask, ft.PagedCache(model.config, kv_cache_dtype="bf16", max_cache_len=64))
    a, b = ref.sequences[:, 20:], got.sequences[:, 20:]
    exact_model = None
    for row in range(a.shape[0]):
        diff = (a[row] != b[row]).nonzero()
        if not diff.numel():
            continue
        step = int(diff[0])
        if exact_model is None:
            exact_model = tiny_llama(rng)
            exact_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        real = int((mask[row] == 0).sum())
        prefix = ref.sequences[row : row + 1, real : 20 + step]
        with torch.no_grad():
            exact = exact_model(input_ids=prefix).logits[0, -1].double()
        noise = float((ref.scores[step][row].double() - exact).abs().max())
        gap = abs(float(exact[int(a[row, step])] - exact[int(b[row, step])]))
        assert gap <= 2 * noise, (row, step, gap, noise, a[row], b[row])


def teacher_forced_logits(model, impl, ids, cont, cache):
    """Logits of every continuation token fed one at a time after a prefill of ids (no padding)."""
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        logits = [out.logits[:, -1]]
        for t in range(cont.shape[1]):
            logits.append(model(input_ids=cont[:, t : t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    return torch.stack(logits, 1).float()


def test_bfloat16_logits_error_at_most_twice_sdpa(rng):
    model = tiny_llama(rng, torch.bfloat16)
    ids, cont = torch.from_numpy(rng.integers(0, 256, (2, 24))), torch.from_numpy(rng.integers(0, 256, (2, 12)))
    exact = teacher_forced_logits(model.float(), "sdpa", ids, cont, DynamicCache(config=model.config))
    model.to(torch.bfloat16)
    sdpa = teacher_forced_logits(model, "sdpa", ids, cont, DynamicCache(config=model.config))
    fkv = teacher_forced_logits(model, "flashkv", ids, cont,
                                ft.PagedCache(model.config, kv_cache_dtype="bf16", max_cache_len=64))
    err, base = float((fkv - exact).abs().max()), float((sdpa - exact).abs().max())
    assert err <= 2 * base, (err, base)


def test_left_padded_batch_equals_each_row_alone(rng):
    model = tiny_llama(rng)
    ids, mask = prompts(rng)
    batch = generate(model, "flashkv", ids, mask, ft.PagedCache(model.config, "int4", max_cache_len=64)).sequences
    for row in range(ids.shape[0]):
        real = ids[row : row + 1, int((mask[row] == 0).sum()) :]
        alone = generate(model, "flashkv", real, None, ft.PagedCache(model.config, "int4", max_cache_len=64))
        mine = alone.sequences[0, real.shape[1] :]
        # generate() stops a lone row at EOS; in the batch a finished row is filled with the pad (= EOS) token
        # until every row is done, so the batch row is the lone row followed only by that token.
        assert torch.equal(mine, batch[row, 20 : 20 + mine.numel()]), row
        rest = batch[row, 20 + mine.numel() :]
        if rest.numel():
            eos = model.generation_config.eos_token_id
            assert int(mine[-1]) == eos and bool((rest == eos).all()), (row, mine, rest)


# ---- quantized caches ----------------------------------------------------------------------------------------------------


def kl_top1(ref, got):
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean()), float((ref.argmax(-1) == got.argmax(-1)).float().mean())


def test_quantized_cache_kernel_and_quantization_error(rng, monkeypatch):
    """Kernel error: every attention from the packed pages vs the float64 reference on that layer's dequantized K/V
    (end-to-end logits cannot separate it: fp32 noise flips quantizer roundings in later layers). Quantization error:
    teacher-forced KL / top-1 vs the unquantized DynamicCache."""
    import flashkv.torch.cache as cache_mod
    from torch_reference import attention_ref

    kernel_err = []
    attend = cache_mod._PagedHandle.attend

    def spy(self, query, key, value, mask, scale, causal, window_left, softcap):
        out = attend(self, query, key, value, mask, scale, causal, window_left, softcap)
        k, v = self.layer.owner.backend.dense(self.layer.idx, torch.float64, query.device)
        ref, _ = attention_ref(query.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                               softmax_scale=scale)
        kernel_err.append(float((out - ref).abs().max()))
        return out

    monkeypatch.setattr(cache_mod._PagedHandle, "attend", spy)
    model = tiny_llama(rng)
    ids, cont = torch.from_numpy(rng.integers(0, 256, (2, 64))), torch.from_numpy(rng.integers(0, 256, (2, 48)))
    ref = teacher_forced_logits(model, "flashkv", ids, cont, DynamicCache(config=model.config))
    res = {}
    for fmt, residual in [("bf16", 0), ("int8", 0), ("int4", 0), ("int2_kivi", 0), ("int2_kivi", 32)]:
        cache = ft.PagedCache(model.config, fmt, max_cache_len=128, residual_tokens=residual)
        kernel_err.clear()
        got = teacher_forced_logits(model, "flashkv", ids, cont, cache)
        assert len(kernel_err) == 3 * 49 and max(kernel_err) < 1e-5, (fmt, residual, max(kernel_err))
        res[(fmt, residual)] = kl_top1(ref, got) + (cache.memory_report()["total_bytes"],)
    print({f"{f}/r{r}": f"KL {kl:.2e} top1 {t:.3f} {nb} B" for (f, r), (kl, t, nb) in res.items()})
    kl = {k: v[0] for k, v in res.items()}
    assert kl[("bf16", 0)] < 1e-3 and res[("bf16", 0)][1] >= 0.95
    assert kl[("bf16", 0)] < kl[("int8", 0)] < kl[("int4", 0)] < kl[("int2_kivi", 0)]
    assert res[("int8", 0)][1] >= 0.85
    assert kl[("int2_kivi", 32)] < kl[("int2_kivi", 0)]  # the bf16 residual window helps
    nbytes = {k: v[2] for k, v in res.items()}
    assert nbytes[("int4", 0)] < nbytes[("int8", 0)] < nbytes[("bf16", 0)]


# ---- training ---------------------------------------------------------------------------------------------------------------


def loss_and_grads(model, impl, **batch):
    model.set_attn_implementation(impl)
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["plain", "padding_mask", "packed_position_ids"])
def test_training_step_matches_sdpa(rng, kind):
    model = tiny_llama(rng).train()
    ids = torch.from_numpy(rng.integers(0, 256, (2, 40)))
    batch = {"input_ids": ids, "labels": ids.clone()}
    if kind == "padding_mask":
        mask = torch.ones_like(ids)
        mask[1, :13] = 0
        batch["attention_mask"] = mask
        batch["labels"][1, :13] = -100
    elif kind == "packed_position_ids":  # three sequences packed in one row (DataCollatorWithFlattening style)
        # use_cache=False: with a cache, transformers' sdpa mask ignores packing (its flash-attention path does not)
        batch = {"input_ids": ids[:1], "labels": ids[:1].clone(), "use_cache": False,
                 "position_ids": torch.cat([torch.arange(n) for n in (11, 20, 9)])[None]}
    ref_loss, ref_g = loss_and_grads(model, "sdpa", **batch)
    loss, g = loss_and_grads(model, "flashkv", **batch)
    assert abs(loss - ref_loss) < 1e-5, (loss, ref_loss)
    assert ref_g.keys() == g.keys()
    for n in g:
        assert torch.allclose(g[n], ref_g[n], rtol=1e-4, atol=1e-6), (n, float((g[n] - ref_g[n]).abs().max()))


# ---- errors -----------------------------------------------------------------------------------------------------------------


def test_errors_name_the_problem(rng):
    model = tiny_llama(rng, attention_dropout=0.1).train()
    model.set_attn_implementation("flashkv")
    ids = torch.from_numpy(rng.integers(0, 256, (1, 8)))
    with pytest.raises(flashkv.UnsupportedError, match="'dropout'"):
        model(input_ids=ids)
    model.eval()
    with pytest.raises(ValueError, match="'max_cache_len'"):
        ft.PagedCache(model.config)
    other = LlamaConfig(**{**model.config.to_dict(), "attn_implementation": "flashkv"})
    other._attn_implementation = "flashkv"
    model.set_attn_implementation("sdpa")  # the model runs sdpa, the cache was told "flashkv"
    with pytest.raises(RuntimeError, match="other than 'flashkv'"):
        model.generate(ids, max_new_tokens=2, past_key_values=ft.PagedCache(other, max_cache_len=32))
    model.set_attn_implementation("flashkv")
    cache = ft.PagedCache(model.config, max_cache_len=32)
    model.generate(ids, max_new_tokens=2, do_sample=False, past_key_values=cache)
    with pytest.raises(flashkv.UnsupportedError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))
    with pytest.raises(flashkv.CapacityError):
        # min_new_tokens: the random model must not stop at an EOS before it outgrows the 16-token cache
        model.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False,
                       past_key_values=ft.PagedCache(model.config, max_cache_len=16))


def test_pages_backend_on_cpu_equals_sdpa(rng):
    """backend="pages" is the CUDA path (torch pages, fused append in paged_decode, the left-padding roll through
    kv_append) run with the CPU operators: float32 greedy tokens equal sdpa's, padded rows included."""
    model = tiny_llama(rng)
    ids, mask = prompts(rng)
    ref = generate(model, "sdpa", ids, mask).sequences
    cache = ft.PagedCache(model.config, kv_cache_dtype="fp32", max_cache_len=64, backend="pages")
    got = generate(model, "flashkv", ids, mask, cache).sequences
    assert torch.equal(got, ref), (ref[:, 20:], got[:, 20:])
    assert cache.memory_report()["pages_used"] == 3 * 3  # 3 sequences x ceil(35 positions / 16)
    nopad = generate(model, "flashkv", ids[:, 11:], None,
                     ft.PagedCache(model.config, "fp32", max_cache_len=64, backend="pages")).sequences
    assert torch.equal(nopad, generate(model, "sdpa", ids[:, 11:], None).sequences)
    sd = generate(model, "sdpa", ids, mask, ft.PagedCache(model.config, "fp32", max_cache_len=64, backend="pages"))
    assert torch.equal(sd.sequences, ref)  # the reference path (dense gather of the pages)
