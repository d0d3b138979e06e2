"""flashkv.Engine (python/flashkv/engine.py over the engine C ABI) on the CPU with the shipped 260K model: the same
tokens and text as the CLI's `flashkv generate --json` for the same prompt, options and seed (greedy and sampled, fp32
and quantized caches, llama2.c and GGUF), the stats, tokenize / detokenize, the seed stream, continuous batching
(add / step / retire equals each request alone; CapacityError changes nothing), and every bad argument → its typed
error. The model comes from tests/common/shipped_model.py (FLASHKV_MODELS_DIR, else scripts/setup's
models/aidreams260k, else ../shared/models); the CLI from FLASHKV_CLI or the build tree
next to the library. The GPU variant is test_engine_cuda.py."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashkv
from flashkv.__main__ import find_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import shipped_model  # noqa: E402

MODELS, MODEL, TOK = shipped_model.MODELS, shipped_model.MODEL, shipped_model.TOKENIZER
pytestmark = pytest.mark.skipif(not shipped_model.PRESENT, reason=shipped_model.MISSING_REASON)
PROMPTS = ["The machine", "Once upon a time, in a quiet lab", ""]


@pytest.fixture(scope="module")
def eng():
    with flashkv.Engine(MODEL, TOK) as e:
        yield e


def cli(*args):
    exe = find_cli()
    if exe is None:
        pytest.skip("the flashkv CLI is not built next to the library (set FLASHKV_CLI)")
    p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p


def cli_generate(prompt, *extra, model=MODEL, tokenizer=TOK):
    args = ["generate", "--model", model, "--prompt", prompt, "--json", *extra]
    if tokenizer is not None:
        args += ["--tokenizer", tokenizer]
    return json.loads(cli(*args).stdout)


@pytest.mark.parametrize("kv", ["fp32", "int8", "int4_kivi"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_the_cli(prompt, kv):
    ref = cli_generate(prompt, "--temperature", "0", "--steps", "80", "--kv-cache", kv)
    with flashkv.Engine(MODEL, TOK, kv_cache_dtype=kv) as e:
        assert e.generate_tokens(prompt, 80, temperature=0) == ref["tokens"]
        assert e.generate(prompt, 80, temperature=0) == ref["text"]
        assert e.last_stats["stop"] == ref["stop"]
        assert e.kv_cache_dtype == ref["kv_cache"]  # the spec as it runs (int4_kivi fitted to head_dim 16)
        assert e.tokenize(prompt) == ref["prompt_tokens"]
        assert e.generate_tokens(ref["prompt_tokens"], 80, temperature=0) == ref["tokens"]  # token-id prompt


def test_sampled_and_default_options_equal_the_cli(rng):
    seed = int(rng.integers(1, 2**63))
    ref = cli_generate("The machine", "--temperature", "0.8", "--top-p", "0.85", "--top-k", "40", "--seed", seed,
                       "--steps", "60")
    with flashkv.Engine(MODEL, TOK) as e:
        out = e.generate_tokens("The machine", 60, temperature=0.8, top_p=0.85, top_k=40, seed=seed)
        assert out == ref["tokens"], f"seed {seed}"
    # the defaults are the CLI's (temperature 1.0, top-p 0.9, seed 42 = Engine(seed=42)'s first call)
    ref = cli_generate("Once upon", "--steps", "50")
    with flashkv.Engine(MODEL, TOK) as e:
        assert e.generate("Once upon", 50) == ref["text"]


def test_stats_are_the_clis(eng):
    ref = cli_generate("The machine", "--temperature", "0", "--steps", "40", "--ignore-eos")
    assert eng.generate_tokens("The machine", 40, temperature=0, stop_at_eos=False) == ref["tokens"]
    s = eng.last_stats
    for key in ("decode_steps", "kv_bytes", "kv_tokens", "stop", "stop_token"):
        assert s[key] == ref[key], key
    assert s["prompt_tokens"] == len(ref["prompt_tokens"]) and s["generated_tokens"] == 40
    assert math.isclose(s["kv_effective_bits"], ref["kv_effective_bits"])
    assert s["prefill_tokens_per_s"] > 0 and s["decode_tokens_per_s"] > 0
    assert math.isclose(s["decode_tokens_per_s"], s["decode_steps"] / s["decode_seconds"], rel_tol=1e-9)
    assert math.isclose(s["prefill_tokens_per_s"], s["prompt_tokens"] / s["prefill_seconds"], rel_tol=1e-9)
    assert s["device"] == "cpu" and s["kv_cache_dtype"] == "fp32"


def test_the_context_bounds_a_long_generation(eng):
    prompt = eng.tokenize("Once upon a time")
    out = eng.generate_tokens(prompt, 2**31 - 1, temperature=0, stop_at_eos=False)  # no 2^31-slot buffer either
    assert len(out) == eng.max_context - len(prompt) + 1 and eng.last_stats["stop"] == "context"


def test_gguf_with_its_embedded_vocabulary(tmp_path, eng):
    gguf = tmp_path / "m.gguf"
    cli("convert", "--model", MODEL, "--tokenizer", TOK, "--to", "gguf", "--type", "f32", "-o", gguf)
    with flashkv.Engine(gguf) as g:
        assert g.model_format == "gguf" and g.vocab_size == 512
        assert g.generate("The machine", 60, temperature=0) == eng.generate("The machine", 60, temperature=0)
        ref = cli_generate("The machine", "--temperature", "0", "--steps", "60", model=gguf, tokenizer=None)
        assert g.generate_tokens("The machine", 60, temperature=0) == ref["tokens"]


def test_named_model(monkeypatch):
    monkeypatch.setenv("FLASHKV_MODELS_DIR", str(MODELS))
    with flashkv.Engine("aidreams260k") as e:
        assert e.model_path == str(MODEL)
        assert e.generate("The machine", 20, temperature=0) == cli_generate(
            "The machine", "--temperature", "0", "--steps", "20")["text"]


def test_tokenize_detokenize(eng):
    text = "Hello, machine dreams \u2728 of light"
    ids = eng.tokenize(text)
    assert ids[0] == eng.bos_id == 1 and eng.add_bos
    assert eng.tokenize(text, add_bos=False) == ids[1:]
    assert eng.tokenize(text.encode()) == ids
    assert eng.detokenize(ids[1:]) == text
    assert eng.detokenize_bytes(np.asarray(ids[1:], dtype=np.int64)) == text.encode()
    assert eng.tokenize("") == [1] and eng.detokenize([]) == ""
    assert eng.config["head_dim"] == 16 and eng.max_context == 128 and eng.device == "cpu"


def test_seed_stream():
    with flashkv.Engine(MODEL, TOK, seed=1234) as e:
        a = e.generate_tokens("The machine", 30)
        assert e.last_stats["seed"] == 1234
        with pytest.raises(ValueError, match="top_p"):
            e.generate_tokens("The machine", 30, top_p=1.5)  # a rejected call takes no seed
        b = e.generate_tokens("The machine", 30)
        assert e.last_stats["seed"] == 1235
        assert a == e.generate_tokens("The machine", 30, seed=1234)
        assert b == e.generate_tokens("The machine", 30, seed=1235)
        e.generate_tokens("The machine", 30)
        assert e.last_stats["seed"] == 1236


def test_batch_equals_each_request_alone(rng, eng):
    prompts = [[1] + rng.integers(3, 512, size=int(n)).tolist() for n in rng.integers(0, 30, size=5)]
    limits = [int(n) for n in rng.integers(1, 40, size=5)]
    refs = [eng.generate_tokens(p, m, temperature=0, stop_at_eos=False) for p, m in zip(prompts, limits)]
    with flashkv.Engine(MODEL, TOK, max_sequences=3) as b:
        got, seq_of, pending = {}, {}, list(range(5))
        while pending or seq_of:
            while pending and len(seq_of) < 3:
                i = pending.pop(0)
                ev = b.add(prompts[i], limits[i], temperature=0, stop_at_eos=False)
                got[i], seq_of[ev.seq] = [ev.token], i
                if ev.stop is not None:
                    assert ev.stop == "steps"
                    b.retire(ev.seq)
                    del seq_of[ev.seq]
            events = b.step()
            assert [e.seq for e in events] == sorted(seq_of)
            for ev in events:
                got[seq_of[ev.seq]].append(ev.token)
                if ev.stop is not None:
                    assert ev.stop == "steps"
                    b.retire(ev.seq)
                    del seq_of[ev.seq]
        assert [got[i] for i in range(5)] == refs
        assert b.step() == []


def test_batch_capacity_errors_change_nothing():
    with flashkv.Engine(MODEL, TOK, max_sequences=1) as b:
        first = b.add("The machine", 10, temperature=0, stop_at_eos=False)
        with pytest.raises(flashkv.CapacityError, match="maximum of 1 sequences"):
            b.add("Once", 10, temperature=0)
        with pytest.raises(flashkv.CapacityError):
            b.generate("Once", 10)  # the one sequence is the request's
        tokens = [first.token]
        while events := b.step():
            tokens.append(events[0].token)
        assert events == [] and len(tokens) == 10
        with pytest.raises(ValueError, match="'seq'"):
            b.retire(first.seq + 5)
        b.retire(first.seq)
        with pytest.raises(ValueError, match="'seq'"):
            b.retire(first.seq)
        assert tokens == b.generate_tokens("The machine", 10, temperature=0, stop_at_eos=False)
    # a page pool too small for the prompt: refused, nothing taken
    with flashkv.Engine(MODEL, TOK, max_sequences=2, kv_capacity_pages=1) as b:
        with pytest.raises(flashkv.CapacityError):
            b.add([1] + [5] * 40, 5)
        ev = b.add([1] + [5] * 20, 5, temperature=0)  # one page: fits
        b.retire(ev.seq)


def _expect(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def test_bad_constructor_arguments(tmp_path):
    E = flashkv.Engine
    _expect(TypeError, "'model'", E, 3)
    _expect(TypeError, "'tokenizer'", E, MODEL, 5)
    _expect(TypeError, "'device'", E, MODEL, TOK, device=0)
    _expect(TypeError, "'kv_cache_dtype'", E, MODEL, TOK, kv_cache_dtype=8)
    _expect(TypeError, "'page_size'", E, MODEL, TOK, page_size="32")
    _expect(TypeError, "'max_sequences'", E, MODEL, TOK, max_sequences=1.0)
    _expect(TypeError, "'seed'", E, MODEL, TOK, seed=None)
    _expect(TypeError, "'rotation'", E, MODEL, TOK, rotation=1)
    _expect(ValueError, "'model'", E, "")
    _expect(ValueError, "'model'", E, "no-such-model")  # not an alias, not a path
    _expect(ValueError, "'device'", E, MODEL, TOK, device="gpu")
    _expect(ValueError, "'device'", E, MODEL, TOK, device="cuda:x")
    _expect(ValueError, "int3", E, MODEL, TOK, kv_cache_dtype="int3")
    _expect(ValueError, "page_size", E, MODEL, TOK, page_size=24)
    _expect(ValueError, "'residual_tokens'", E, MODEL, TOK, residual_tokens=-1)
    _expect(ValueError, "'sink_tokens'", E, MODEL, TOK, sink_tokens=-1)
    _expect(ValueError, "'rotation'", E, MODEL, TOK, rotation="random")
    _expect(ValueError, "'max_sequences'", E, MODEL, TOK, max_sequences=0)
    _expect(ValueError, "'max_context'", E, MODEL, TOK, max_context=-1)
    _expect(ValueError, "'max_context'", E, MODEL, TOK, max_context=129)
    _expect(ValueError, "'max_context'", E, MODEL, TOK, max_context=2**31)  # no int32 wrap-around
    _expect(ValueError, "kv_capacity_pages", E, MODEL, TOK, kv_capacity_pages=-1)
    _expect(ValueError, "'seed'", E, MODEL, TOK, seed=-1)
    _expect(FileNotFoundError, "nonexistent", E, tmp_path / "nonexistent.bin", TOK)
    _expect(FileNotFoundError, "nonexistent", E, MODEL, tmp_path / "nonexistent.tok")
    bad = tmp_path / "corrupt.bin"
    bad.write_bytes(b"\x07" * 40)
    with pytest.raises(OSError) as ei:
        E(bad, TOK)
    assert not isinstance(ei.value, FileNotFoundError) and "corrupt.bin" in str(ei.value)
    _expect(OSError, "tokenizer", E, MODEL)  # a llama2.c checkpoint needs its tokenizer file


def test_cuda_without_a_cuda_engine_is_unsupported():
    try:
        e = flashkv.Engine(MODEL, TOK, device="cuda")
    except flashkv.UnsupportedError as err:
        assert "cuda" in str(err).lower() or "cublas" in str(err).lower()
    else:  # a CUDA build on a GPU machine: test_engine_cuda.py checks it
        e.close()


def test_bad_call_arguments(eng):
    g = eng.generate_tokens
    _expect(TypeError, "'prompt'", eng.generate, [1, 2, 3])  # token ids go to generate_tokens
    _expect(TypeError, "'prompt'", g, None)
    _expect(TypeError, "'prompt'", g, 3.5)
    _expect(TypeError, r"'prompt\[1\]'", g, [1, "a"])
    _expect(TypeError, r"'prompt\[0\]'", g, [True])
    _expect(TypeError, "'prompt'", g, np.array([1.0, 2.0]))
    _expect(TypeError, "'prompt'", g, np.array([[1, 2]]))
    _expect(ValueError, "'prompt'", g, [])
    _expect(ValueError, "'prompt'", g, [1] * 129)  # longer than the context
    _expect(ValueError, "int32", g, [1, 2**40])
    _expect(ValueError, r"'tokens\[1\]'", g, [1, 512])
    _expect(ValueError, r"'tokens\[1\]'", g, [1, -3])
    _expect(TypeError, "'max_new_tokens'", g, "a", 2.5)
    _expect(ValueError, "'max_new_tokens'", g, "a", 0)
    _expect(ValueError, "'max_new_tokens'", g, "a", 2**31)
    _expect(TypeError, "'temperature'", g, "a", temperature="hot")
    _expect(ValueError, "'temperature'", g, "a", temperature=-1.0)
    _expect(ValueError, "'temperature'", g, "a", temperature=float("nan"))
    _expect(ValueError, "'temperature'", g, "a", temperature=float("inf"))
    _expect(ValueError, "'top_p'", g, "a", top_p=0.0)
    _expect(ValueError, "'top_p'", g, "a", top_p=1.01)
    _expect(ValueError, "'top_k'", g, "a", top_k=-1)
    _expect(TypeError, "'top_k'", g, "a", top_k=None)
    _expect(ValueError, "'seed'", g, "a", seed=2**64)
    _expect(TypeError, "'stop_at_eos'", g, "a", stop_at_eos="yes")
    _expect(TypeError, "'text'", eng.tokenize, 5)
    _expect(TypeError, "'add_bos'", eng.tokenize, "a", add_bos="no")
    _expect(TypeError, "'tokens'", eng.detokenize, "abc")
    _expect(ValueError, "'token'", eng.detokenize, [3, 9999])
    _expect(TypeError, "'seq'", eng.retire, "0")
    _expect(ValueError, "'prompt'", eng.add, [])
    assert eng.generate("a", 5, temperature=0)  # the engine still works after all of that


def test_threads_share_one_engine(eng):
    """Calls from several threads on one Engine run one at a time (a lock per engine): the same results as in turn."""
    from concurrent.futures import ThreadPoolExecutor
    prompts = ["The machine", "Once upon", "Echoes of light", "A quiet lab"] * 3
    want = [eng.generate_tokens(p, 30, temperature=0) for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda p: eng.generate_tokens(p, 30, temperature=0), prompts))
    assert got == want


def test_closed_engine_raises():
    e = flashkv.Engine(MODEL, TOK)
    e.close()
    e.close()  # idempotent
    _expect(ValueError, "closed", e.generate, "a")
    _expect(ValueError, "closed", e.tokenize, "a")
    assert "closed" in repr(e)


def test_documented_examples(tmp_path):
    """docs/python.md's Engine section: the shell command prints the text its comment shows; the Python example runs
    (its models/aidreams260k, where scripts/setup copies the model, = the folder the tests read it from)."""
    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "python.md").read_text()
    section = doc[doc.index("## Generation engine (`flashkv.Engine`)"):]
    section = section[: section.index("\n## ", 10)]
    bash = section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    cmd, want = bash[0], bash[1].removeprefix("# ")
    assert "shared/models" not in section, "docs/python.md names ../shared/models (only a clone beside it has that)"
    env = dict(os.environ, PYTHONPATH=str(repo / "python"))
    p = subprocess.run(cmd.replace("python -c", "python3 -c"), shell=True, capture_output=True, text=True, timeout=120,
                       env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.rstrip("\n") == want
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example.replace("models/aidreams260k", str(MODELS)), "docs/python.md", "exec"), {})
