"""Helpers both trainers (SFT and ADRPO) use: loading the policy model with an optional LoRA
config or an existing adapter. The recipe parser (``--config R.yaml`` plus CLI overrides,
CPU-safe TRL defaults) is :func:`training_parser` (``python -m memgym.training.<stage>`` and ``memgym
train <stage>`` alike); the model path rules are :func:`memgym.llm.specs.resolve_model_path`.

Sources: ``docs/design.md`` § "Training stack" (configs are dataclasses parsed by
``trl.TrlParser``; CPU facts for TRL 1.16: pass ``bf16=False`` and ``use_cpu=True``) and
§ "Embedded defaults" (the policy ``smollm2`` is the SmolLM2-135M-Instruct dir prepared by
:func:`memgym.llm.models.prepare_smollm2`).
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trl import ModelConfig

from memgym.llm.specs import EMBEDDED_MODEL as EMBEDDED_POLICY, resolve_model_path

def cuda_available() -> bool:
    """True when torch sees at least one CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def device_defaults(cuda: bool | None = None) -> dict:
    """Field values that let a TRL config run on a machine without CUDA: ``use_cpu`` True,
    ``bf16``/``fp16`` False (TRL 1.16 defaults ``bf16`` to True). They override the recipe
    YAML; a flag on the command line overrides them. With CUDA (``cuda=None`` asks torch): none."""
    cuda = cuda_available() if cuda is None else cuda
    return {} if cuda else {"use_cpu": True, "bf16": False, "fp16": False}


def training_parser(dataclass_types, prog: str, description: str):
    """The recipe parser of a trainer (:class:`memgym.llm.recipe.RecipeParser` of
    ``dataclass_types``) with :func:`device_defaults` between the recipe and the flags; the one
    ``memgym train <stage>`` and ``python -m memgym.training.<stage>`` parse with."""
    from memgym.llm.recipe import RecipeParser

    return RecipeParser(dataclass_types, prog=prog, description=description, defaults=lambda _argv: device_defaults())


#: Attention projections of Llama/Qwen-style models; the default LoRA targets.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def resume_arg(value):
    """``resume_from_checkpoint`` for ``Trainer.train``: None/""/"false" → None, "true"/"last" →
    True, else the value (a checkpoint dir).
    """
    if value is None or str(value).lower() in ("", "false", "none", "no"):
        return None
    return True if str(value).lower() in ("true", "last", "yes") else value


def is_adapter_dir(path: str | Path) -> bool:
    """True when ``path`` is a PEFT adapter dir (holds ``adapter_config.json``)."""
    return (Path(path) / "adapter_config.json").is_file()


@dataclass
class PolicyModelConfig(ModelConfig):
    """``trl.ModelConfig`` with memgym's defaults (embedded SmolLM2, float32, LoRA on the attention
    projections). Raises ValueError naming the field for an empty model name, ``lora_r`` < 1,
    ``lora_alpha`` <= 0, ``lora_dropout`` outside [0, 1) or no targets.
    """

    _argument_group_name = ("model and LoRA: trl.ModelConfig fields, memgym defaults "
                            "(https://huggingface.co/docs/trl/main/en/script_utils#trl.ModelConfig)")

    model_name_or_path: str = field(default=EMBEDDED_POLICY, metadata={
        "help": "'smollm2' (the embedded SmolLM2-135M-Instruct), a local dir, an adapter dir or a hub id"})
    use_peft: bool = field(default=True, metadata={"help": "train a LoRA adapter (true) or fully fine-tune (false); "
                                                           "ignored when starting from an adapter dir"})
    lora_target_modules: list[str] | None = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS),
                                                  metadata={"help": "module names LoRA adapts"})

    CHECKS = {"lora_r": {"min": 1}, "lora_alpha": {"min": 1}}

    def __post_init__(self):
        from memgym.llm.checks import check_fields

        check_fields(self)  # string -> one-element list, counts (memgym.llm.checks)
        targets = self.lora_target_modules
        super().__post_init__()
        if isinstance(targets, list) and targets != ["all-linear"]:
            # ModelConfig turns a one-name list into a str, which PEFT reads as a regex over the full
            # module path (so ["q_proj"] would match nothing); keep the list of module names
            self.lora_target_modules = targets
        if not self.model_name_or_path or not str(self.model_name_or_path).strip():
            raise ValueError("model_name_or_path is empty")
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}")
        if self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_target_modules is not None and not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if dtype == "auto":
        return torch.bfloat16 if cuda_available() and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype)


def load_tokenizer(path: str | Path):
    """The tokenizer at ``path`` with a pad token (the EOS token when it has none) and a chat
    template (SmolLM2's ChatML when it has none). Raises ValueError when the tokenizer has
    neither pad nor EOS token."""
    from transformers import AutoTokenizer

    from memgym.llm.models import SMOLLM2_CHAT_TEMPLATE

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer at {path} has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tok


@dataclass
class Policy:
    """A loaded policy: ``model`` (``PreTrainedModel`` or trainable ``PeftModel``), ``peft_config``
    (the ``LoraConfig`` to apply, or None), ``path`` and ``base_path``.
    """

    model: object
    tokenizer: object
    peft_config: object | None
    path: str
    base_path: str

    @property
    def is_adapter(self) -> bool:
        return self.path != self.base_path


def score_labelled_positions_only() -> None:
    """Make TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``, which ``SFTTrainer`` and
    ``GRPOTrainer`` install on the policy) project only the positions that carry a label, on every
    device. TRL 1.16 does so on Triton devices (CUDA, XPU) and projects every position elsewhere,
    to keep tile shapes fixed for compiled backends (Neuron). Eager CPU compiles nothing, and the
    unlabelled positions are masked to zero either way, so loss and gradients are unchanged; the LM
    head then costs the labelled tokens only (a manager prompt is ~10x its completion). Measured
    side by side: ``scripts/experiments/cpu_logprob/run.py``. Idempotent; a TRL without the hook
    (``trl.trainer.utils._use_triton``) is left as it is."""
    import trl.trainer.utils as trl_utils

    device_rule = getattr(trl_utils, "_use_triton", None)
    if device_rule is None or hasattr(device_rule, "every_position_rule"):
        return

    def labelled_only(device) -> bool:
        return device.type == "cpu" or device_rule(device)

    labelled_only.every_position_rule = device_rule  # TRL's own rule, kept for side-by-side measurement
    trl_utils._use_triton = labelled_only


def load_policy(model_args: ModelConfig, init_from: str | None = None) -> Policy:
    """Load the policy to train from ``init_from`` or ``model_args.model_name_or_path`` (a model
    spec, dir, hub id, or adapter dir, attached trainable to its base; ``use_peft`` is then
    ignored). ``dtype``: one of :data:`DTYPES` (``auto``: bf16 on a capable GPU, else float32).
    Raises FileNotFoundError / ValueError for a bad path.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from trl import get_peft_config

    score_labelled_positions_only()  # the trainers' LM head scores completions only, also on CPU

    path = resolve_model_path(init_from or model_args.model_name_or_path)
    torch_dtype = _torch_dtype(model_args.dtype or "float32")
    if is_adapter_dir(path):
        from peft import PeftModel

        cfg = json.loads((Path(path) / "adapter_config.json").read_text())
        base = cfg.get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{path}/adapter_config.json has no base_model_name_or_path")
        base = resolve_model_path(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
        model = PeftModel.from_pretrained(model, path, is_trainable=True)
        tok_dir = path if (Path(path) / "tokenizer_config.json").is_file() else base
        return Policy(model, load_tokenizer(tok_dir), None, path, base)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    return Policy(model, load_tokenizer(path), get_peft_config(model_args), path, path)


@contextmanager
def outside_zero3(training_args):
    """A block in which transformers treats this process as outside DeepSpeed ZeRO-3: models that
    ``from_pretrained`` loads here are whole (no ``deepspeed.zero.Init``), and ``generate`` does not
    step in lockstep with the other processes (``synced_gpus``). For every model but the policy (the
    embedder, the reward's HF backends) and for generation by one process alone.

    Why: under ``accelerate launch`` with a DeepSpeed config, ``TrainingArguments.__post_init__``
    registers the plugin's ``HfDeepSpeedConfig`` (accelerate ``DeepSpeedPlugin.set_deepspeed_weakref``,
    whatever ``zero3_init_flag`` says), and transformers then partitions every model it loads
    (``modeling_utils``: ``needs_zero3_init = is_deepspeed_zero3_enabled()``); a model outside the
    engine stays partitioned, and its first forward fails (``'weight' must be 2-D``). accelerate's
    ``zero3_init_context_manager(enable=False)`` re-registers the same stage-3 config, so it does not
    help. Elsewhere (no DeepSpeed, ZeRO-1/2) the block changes nothing."""
    from transformers.integrations import set_hf_deepspeed_config, unset_hf_deepspeed_config

    dschf = getattr(getattr(training_args, "deepspeed_plugin", None), "dschf", None)
    if dschf is None or not dschf.is_zero3():
        yield
        return
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(dschf)


@contextmanager
def gathered(model):
    """``model`` with all its weights on this process for the block, when ZeRO-3 partitioned them
    at load and no engine manages them yet (``deepspeed.zero.GatheredParameters``: a collective, so
    every process enters the block); a model with no partitioned weight is used as it is."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield
