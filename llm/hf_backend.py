"""In-process transformers backend (``hf:<path>``): chat-template prompts, left-padded, generated
in chunks of ``batch_size``; token counts in the model's own tokenizer."""
from __future__ import annotations

import json
import os
from pathlib import Path

from memgym.llm.base import BackendSpecError, Completion, GenerationParams, Messages, check_batch
from memgym.llm.paths import dir_fingerprint
from memgym.llm.structured import JsonSchema, check_schemas


def _is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file()


class HFBackend:
    """Chat generation with a local transformers causal LM (optionally a PEFT adapter).

    Args:
        model_dir_or_model: a model dir, a PEFT adapter dir, or a loaded model (then ``tokenizer``
            is required). base: an adapter's base dir (default its local ``base_model_name_or_path``).
        device, batch_size (prompts per ``generate``, >= 1), dtype (default float32), progress.
        model_id: default ``hf:<dir>@<fingerprint>`` (:func:`memgym.llm.paths.dir_fingerprint`).

    Decoding: greedy at temperature 0, else nucleus sampling (Holtzman et al. 2020), no top-k;
    ``params.seed`` seeds a forked torch RNG per call. ``calls`` counts prompts. Raises
    :class:`BackendSpecError` for a missing dir or non-local adapter base.
    """

    def __init__(self, model_dir_or_model, tokenizer=None, *, base: str | Path | None = None,
                 device: str = "cpu", batch_size: int = 8, dtype=None, progress: bool = False,
                 model_id: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"HFBackend batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.device = device
        self.progress = progress
        self.calls = 0
        dtype = dtype if dtype is not None else torch.float32

        if isinstance(model_dir_or_model, (str, Path)):
            path = Path(model_dir_or_model).expanduser().resolve()
            if not path.is_dir():
                raise BackendSpecError(f"HFBackend: model dir {path} does not exist")
            if _is_adapter_dir(path):
                from peft import PeftModel

                cfg = json.loads((path / "adapter_config.json").read_text())
                base_path = Path(base) if base is not None else Path(str(cfg.get("base_model_name_or_path") or ""))
                if not str(base_path) or not base_path.is_dir():
                    raise BackendSpecError(
                        f"HFBackend: adapter {path} names base model {str(base_path)!r}, which is not a local dir; "
                        "pass base=<dir of the base model>"
                    )
                base_model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=dtype)
                model = PeftModel.from_pretrained(base_model, str(path))
                tok_src = path if _has_tokenizer(path) else base_path
                default_id = f"hf:{base_path.resolve()}@{dir_fingerprint(base_path)}+{path}@{dir_fingerprint(path)}"
            else:
                model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
                tok_src = path
                default_id = f"hf:{path}@{dir_fingerprint(path)}"
            if tokenizer is None:
                if not _has_tokenizer(tok_src):
                    raise BackendSpecError(f"HFBackend: no tokenizer files (tokenizer_config.json) in {tok_src}")
                tokenizer = AutoTokenizer.from_pretrained(str(tok_src))
        else:
            model = model_dir_or_model
            if tokenizer is None:
                raise ValueError("HFBackend: a tokenizer is required when passing a model object")
            default_id = "hf:" + str(getattr(model, "name_or_path", "") or type(model).__name__)

        self.model = model.to(device)
        self.model.eval()
        self.model_id = model_id or default_id
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if not getattr(tokenizer, "chat_template", None):
            raise BackendSpecError(f"HFBackend: the tokenizer of {self.model_id} has no chat template")
        self.tokenizer = tokenizer
        self._eos_ids = self._collect_eos_ids()
        self._schema_compiler = None
        self.grammar_seconds = 0.0  # wall time in grammar masking (constrained calls), cumulative

    def _collect_eos_ids(self) -> list[int]:
        ids: list[int] = []
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for v in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) + [self.tokenizer.eos_token_id]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
        if not ids:
            raise BackendSpecError(f"HFBackend: {self.model_id} defines no EOS token")
        return ids

    def count_tokens(self, text: str) -> int:
        """Number of policy-tokenizer tokens in ``text`` (no special tokens added)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: Messages) -> str:
        """The exact prompt string fed to the model (chat template + generation prompt)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _generation_config(self, params: GenerationParams):
        from transformers import GenerationConfig

        kw = dict(max_new_tokens=params.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                  eos_token_id=self._eos_ids)
        if params.greedy:
            return GenerationConfig(do_sample=False, **kw)
        return GenerationConfig(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0, **kw)

    def schema_compiler(self):
        """The :class:`memgym.llm.grammar.SchemaCompiler` of this tokenizer (built on first use)."""
        if self._schema_compiler is None:
            from memgym.llm.grammar import SchemaCompiler

            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            self._schema_compiler = SchemaCompiler(self.tokenizer, self._eos_ids,
                                                   vocab_size=max(int(vocab or 0), len(self.tokenizer)))
        return self._schema_compiler

    def generate(self, batch: list[Messages], params: GenerationParams,
                 schemas: list[JsonSchema | None] | None = None) -> list[Completion]:
        """One :class:`Completion` per conversation, in order. ``schemas[i]`` constrains row i
        through :class:`memgym.llm.grammar.SchemaLogitsProcessor`. ``completion_tokens`` counts up to and
        including the first EOS (``"stop"``), else all ``max_new_tokens`` (``"length"``)."""

        import torch
        from tqdm.auto import tqdm

        check_batch(batch)
        schemas = check_schemas(schemas, len(batch))
        if not batch:
            return []
        gen_cfg = self._generation_config(params)
        out: list[Completion] = []
        chunks = [batch[i:i + self.batch_size] for i in range(0, len(batch), self.batch_size)]
        with torch.random.fork_rng(devices=self._rng_devices()), torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for k, chunk in enumerate(tqdm(chunks, desc=f"generate {self.model_id[:40]}", disable=not self.progress)):
                out.extend(self._generate_chunk(chunk, gen_cfg, schemas[k * self.batch_size:(k + 1) * self.batch_size]))
        return out

    def _rng_devices(self) -> list:
        import torch

        dev = torch.device(self.device)
        if dev.type == "cuda":
            return [dev.index if dev.index is not None else torch.cuda.current_device()]
        return []

    def _generate_chunk(self, chunk: list[Messages], gen_cfg, schemas: list) -> list[Completion]:
        texts = [self.render(m) for m in chunk]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        extra = {}
        if any(s is not None for s in schemas):
            from transformers import LogitsProcessorList

            from memgym.llm.grammar import SchemaLogitsProcessor

            comp = self.schema_compiler()
            matchers = [comp.matcher(s) if s is not None else None for s in schemas]
            proc = SchemaLogitsProcessor(matchers, enc["input_ids"].shape[1], comp.vocab_size)
            extra["logits_processor"] = LogitsProcessorList([proc])
        seq = self.model.generate(**enc, generation_config=gen_cfg, **extra)
        if extra:
            self.grammar_seconds += proc.seconds
        gen = seq[:, enc["input_ids"].shape[1]:].tolist()
        eos = set(self._eos_ids)
        result = []
        for row, plen in zip(gen, prompt_lens):
            stop_at = next((k for k, t in enumerate(row) if t in eos), None)
            if stop_at is None:
                n, reason, body = len(row), "length", row
            else:
                n, reason, body = stop_at + 1, "stop", row[:stop_at]
            text = self.tokenizer.decode(body, skip_special_tokens=True)
            result.append(Completion(text=text, prompt_tokens=int(plen), completion_tokens=n, finish_reason=reason))
        self.calls += len(chunk)
        return result
