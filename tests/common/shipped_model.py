"""Where the Python tests find the 260K llama2.c test model (aidreams260K.bin + aidreams260K.tok512.bin), in the order
of flashkv::shipped_models_dir() (src/engine/model_registry.cpp), so that a test and the CLI or library it drives read
the same files: $FLASHKV_MODELS_DIR if set; else the first folder holding aidreams260K.bin of
$FLASHKV_MODEL_HOME/aidreams260k (<repo>/models/aidreams260k when that is unset or empty: scripts/setup copies them
there) and <repo>/../shared/models (the reference folder beside a clone); else the former.
Import it with `sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))`."""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_DIR = Path(os.environ.get("FLASHKV_MODEL_HOME") or REPO / "models") / "aidreams260k"  # fetched_models_dir()
SHARED_DIR = REPO.parent / "shared" / "models"
MODEL_FILE, TOKENIZER_FILE = "aidreams260K.bin", "aidreams260K.tok512.bin"


def holds_model(d: Path) -> bool:
    return (d / MODEL_FILE).is_file() and (d / TOKENIZER_FILE).is_file()


def models_dir() -> Path:
    env = os.environ.get("FLASHKV_MODELS_DIR")
    if env:
        return Path(env)
    return next((d for d in (SETUP_DIR, SHARED_DIR) if (d / MODEL_FILE).is_file()), SETUP_DIR)


MODELS = models_dir()
MODEL, TOKENIZER = MODELS / MODEL_FILE, MODELS / TOKENIZER_FILE
PRESENT = holds_model(MODELS)
MISSING_REASON = (f"the 260K test model is not in {MODELS}: run scripts/setup (it copies {MODEL_FILE} and "
                  f"{TOKENIZER_FILE} into {SETUP_DIR}), or set FLASHKV_MODELS_DIR to the folder holding them")
