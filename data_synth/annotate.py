"""LLM capability annotator for training and validation tasks (never the test split).

Source: PrisMem (arXiv 2610.06361) § "capabilities": train/validation
tasks get one primary capability ℓ(x) ∈ C and up to two secondaries σ(x) ⊆ C \\ {ℓ(x)} from an
LLM; test questions use the native mapping (:mod:`memgym.data_synth.capabilities`). The reply
``{"primary": "T", "secondary": ["M"]}`` is validated by :class:`CapabilityLabel`; a rejected
reply is retried up to ``max_retries`` times, then the native label is used (``fallback=True``).
Annotator labels are kept in a resumable JSONL file keyed by (question id, annotator model id);
a fallback is not (nor is any rejected reply kept in the response cache), so a rerun asks again.
:func:`agreement` reports, as PrisMem does for BEAM-1M, the labels' agreement with the native
mapping over the annotator's labels (fallbacks left out and counted): per native type, the share
of annotated primaries equal to :func:`memgym.data_synth.capabilities.capability_for`'s, and the
confusion table native (rows) x annotated (columns).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import json_repair
import pydantic

from memgym.data_synth.capabilities import LOCOMO_CATEGORY_NAMES, capability_for, secondary_for
from memgym.data_synth.errors import DataFormatError
from memgym.data_synth.jsonl import ResumableJsonl
from memgym.data_synth.splits import split_ids
from memgym.llm.base import Backend, GenerationParams, LLMError
from memgym.llm.errors import MemgymError
from memgym.memory_bank.schema import CAPABILITY_NAMES, Capability, Conversation, QAItem

Letter = Literal["F", "T", "P", "M", "A"]

ANNOTATOR_SYSTEM_PROMPT = (
    "You label questions about long conversations with the memory capabilities they test.\n"
    "F factual retrieval: recall a stated fact (who, what, where).\n"
    "T temporal tracking: dates, durations, the order of events, or a value that changed over time.\n"
    "P preference extraction: the speaker's likes, dislikes, tastes, opinions or what they would choose.\n"
    "M multi-session synthesis: combine information from several sessions or count/aggregate it.\n"
    "A adversarial: the question has a false premise, contradicts the history, or cannot be answered "
    "from it (abstention).\n"
    "Give exactly one primary capability (the main one) and zero to two secondary capabilities "
    "(others the question also needs), different from the primary and from each other.\n"
    'Reply with one JSON object and nothing else, e.g. {"primary": "T", "secondary": ["M"]}'
)


class LabelValidationError(MemgymError, ValueError):
    """An annotator reply that is not a valid label; ``reason`` says why."""

    kind = "data"

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CapabilityLabel(pydantic.BaseModel):
    """A validated label: ``primary`` ∈ {F,T,P,M,A}; ``secondary``: at most two distinct
    letters, none equal to the primary."""

    model_config = pydantic.ConfigDict(extra="forbid")
    primary: Letter
    secondary: list[Letter] = pydantic.Field(default_factory=list, max_length=2)

    @pydantic.field_validator("primary", mode="before")
    @classmethod
    def _upper_primary(cls, v):
        return v.strip().upper() if isinstance(v, str) else v

    @pydantic.field_validator("secondary", mode="before")
    @classmethod
    def _upper_secondary(cls, v):
        if v is None:
            return []
        if isinstance(v, str):
            v = [v] if v.strip() else []
        return [x.strip().upper() if isinstance(x, str) else x for x in v] if isinstance(v, list) else v

    @pydantic.model_validator(mode="after")
    def _distinct(self):
        if len(set(self.secondary)) != len(self.secondary):
            raise ValueError(f"secondary has duplicates: {self.secondary}")
        if self.primary in self.secondary:
            raise ValueError(f"primary {self.primary} is also listed as secondary")
        return self


def parse_label(text: str) -> CapabilityLabel:
    """Parse and validate one annotator reply (code fences and small JSON damage tolerated).
    Raises :class:`LabelValidationError` with the reason (no JSON object, unknown letter,
    duplicate, primary in secondary, more than two secondaries, extra keys)."""
    if not isinstance(text, str) or not text.strip():
        raise LabelValidationError("empty reply")
    data = json_repair.repair_json(text, return_objects=True)
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise LabelValidationError(f"no JSON object in the reply {text[:80]!r}")
    try:
        return CapabilityLabel.model_validate(data)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "label"
        raise LabelValidationError(f"{loc}: {err['msg']}") from None


@dataclass(frozen=True)
class AnnotatedLabel:
    """One task's labels. ``source``: "annotator" or "native" (fallback); ``fallback``: the
    annotator failed validation on every attempt; ``attempts``: annotator calls made (0 when
    read from the label file); ``error``: the last validation failure, else None."""

    qid: str
    primary: Capability
    secondary: tuple[Capability, ...]
    source: str
    fallback: bool
    attempts: int
    model: str
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def to_json(self) -> dict:
        return {"qid": self.qid, "primary": self.primary.value, "secondary": [c.value for c in self.secondary],
                "source": self.source, "fallback": self.fallback, "attempts": self.attempts, "model": self.model,
                "error": self.error, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}

    @classmethod
    def from_json(cls, d: dict, file="<labels>", line: int = 0) -> "AnnotatedLabel":
        """Inverse of :meth:`to_json`; raises :class:`DataFormatError` naming file, line, field."""
        rec = f"line {line}"
        try:
            label = CapabilityLabel.model_validate({"primary": d.get("primary"), "secondary": d.get("secondary", [])})
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            raise DataFormatError(file, rec, ".".join(map(str, err["loc"])) or "primary", err["msg"]) from None
        for k in ("qid", "model"):
            if not isinstance(d.get(k), str):
                raise DataFormatError(file, rec, k, f"expected a str, got {type(d.get(k)).__name__}")
        return cls(d["qid"], Capability(label.primary), tuple(Capability(c) for c in label.secondary),
                   str(d.get("source", "annotator")), bool(d.get("fallback", False)), int(d.get("attempts", 0)),
                   d["model"], d.get("error"), int(d.get("prompt_tokens", 0)), int(d.get("completion_tokens", 0)))


def annotation_messages(conv: Conversation, qa: QAItem) -> list[dict]:
    """The annotator prompt for one task: question, reference answer, evidence turns."""
    index = conv.turn_index
    ev = [index[e][1].render() for e in dict.fromkeys(qa.evidence) if e in index]
    user = (f"Question: {qa.question}\nReference answer: {qa.answer}\nEvidence:\n"
            + ("\n".join(ev) if ev else "(none)") + "\n\nLabel this question.")
    return [{"role": "system", "content": ANNOTATOR_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def refuse_test(dataset: str, conversations: list[Conversation], split: str) -> None:
    """Raise ValueError when ``split`` is the test split, or when any conversation (LoCoMo,
    BEAM) or question id (LongMemEval) belongs to the test split: test tasks keep native labels."""
    ds = dataset.strip().lower()
    if split == "test":
        raise ValueError(f"the annotator refuses the {ds} test split: test questions use the native mapping")
    if ds == "locomo":
        test = set(split_ids("locomo", "test"))
        bad = sorted(c.id for c in conversations if c.id in test)
    elif ds == "longmemeval":
        test = set(split_ids("longmemeval", "test"))
        bad = sorted(q.id for c in conversations for q in c.questions if q.id in test)
    elif ds == "beam":
        test = set(split_ids("beam", "test"))
        bad = sorted(c.id for c in conversations if c.id in test)
    else:
        raise ValueError(f"no splits known for dataset {dataset!r}; cannot check that it is not a test split")
    if bad:
        raise ValueError(f"the annotator refuses test-split items ({len(bad)}, e.g. {bad[:3]}): use native labels")


class CapabilityAnnotator:
    """Annotates training/validation tasks with ``backend``; ``label_file``: JSONL cache of the
    annotator's labels (None: none; fallbacks are not written); ``max_retries`` >= 0; ``calls``
    counts prompts sent."""

    def __init__(self, backend: Backend, label_file: str | Path | None = None, *, max_retries: int = 2,
                 params: GenerationParams = GenerationParams(max_new_tokens=64, temperature=0.0), chunk: int = 32):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.chunk = chunk
        self.backend, self.max_retries, self.params = backend, max_retries, params
        self.label_file = None if label_file is None else Path(label_file)
        self.model = str(getattr(backend, "model_id", "?"))
        self.calls = 0

    def annotate(self, dataset: str, conversations: list[Conversation], split: str) -> dict[str, AnnotatedLabel]:
        """``{question id: label}`` for every question (label-file hits reused, the rest annotated
        in batched rounds and appended). ValueError for the test split (:func:`refuse_test`)."""
        refuse_test(dataset, conversations, split)
        tasks = [(c, q) for c in conversations for q in c.questions]
        out: dict[str, AnnotatedLabel] = {}
        store = ResumableJsonl(self.label_file, key=lambda r: (r["qid"], r["model"])) if self.label_file else None
        try:
            if store is not None:
                for no, r in enumerate(store.records, 1):
                    if r["model"] == self.model:
                        out[r["qid"]] = AnnotatedLabel.from_json(r, self.label_file, no)
            todo = [(c, q) for c, q in tasks if q.id not in out]
            for start in range(0, len(todo), self.chunk):
                self._annotate_chunk(dataset, todo[start:start + self.chunk], out, store)
        finally:
            if store is not None:
                store.close()
        return out

    def _annotate_chunk(self, dataset: str, todo: list, out: dict, store) -> None:
        """Annotate ``todo`` ((conversation, question) pairs) with retries; add to ``out`` and
        append to ``store``."""
        msgs = {q.id: annotation_messages(c, q) for c, q in todo}
        conv_of = {q.id: c for c, q in todo}
        errors: dict[str, str] = {}
        attempts = {q.id: 0 for _, q in todo}
        cost = {q.id: [0, 0] for _, q in todo}
        pending = [q for _, q in todo]
        for _ in range(self.max_retries + 1):
            if not pending:
                break
            comps = self.backend.generate([msgs[q.id] for q in pending], self.params)
            if len(comps) != len(pending):
                raise LLMError(f"annotator backend {self.model} returned {len(comps)} completions for "
                               f"{len(pending)} prompts")
            self.calls += len(pending)
            still, rejected = [], []
            for q, c in zip(pending, comps):
                attempts[q.id] += 1
                if not c.cached:
                    cost[q.id][0] += c.prompt_tokens
                    cost[q.id][1] += c.completion_tokens
                try:
                    lab = parse_label(c.text)
                except LabelValidationError as e:
                    errors[q.id] = e.reason
                    rejected.append(msgs[q.id])
                    msgs[q.id] = msgs[q.id] + [
                        {"role": "assistant", "content": c.text},
                        {"role": "user", "content": f"That reply is invalid ({e.reason}). Reply again with only "
                                                    'the JSON object {"primary": ..., "secondary": [...]}.'}]
                    still.append(q)
                    continue
                out[q.id] = AnnotatedLabel(q.id, Capability(lab.primary), tuple(Capability(x) for x in lab.secondary),
                                           "annotator", False, attempts[q.id], self.model, None, *cost[q.id])
                if store is not None:
                    store.append(out[q.id].to_json())
            forget = getattr(self.backend, "forget", None)
            if rejected and callable(forget):  # a rejected reply is not an answer to keep
                forget(rejected, self.params)
            pending = still
        for q in pending:  # every attempt failed: native mapping, flagged, not kept (a rerun asks again)
            conv = conv_of[q.id]
            n_sess = len(conv.evidence_sessions(q))
            out[q.id] = AnnotatedLabel(q.id, capability_for(dataset, q.category, q.id),
                                       secondary_for(dataset, q.category, q.id, n_sess), "native", True,
                                       attempts[q.id], self.model, errors.get(q.id), *cost[q.id])


def load_labels(path: str | Path) -> dict[str, AnnotatedLabel]:
    """Read a label file ({question id: label}; a later line for the same id wins).
    Raises FileNotFoundError naming the path, :class:`DataFormatError` for a broken line."""
    import json

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"capability label file not found: {p} (make it once per split with: memgym annotate "
                                f"--dataset D --split train|valid --annotator SPEC --out {p})")
    from memgym.data_synth.paths import record_read

    record_read(p, "capability labels")
    out = {}
    for no, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except ValueError as e:
            raise DataFormatError(p, f"line {no}", "-", f"invalid JSON: {e}") from None
        if not isinstance(d, dict):
            raise DataFormatError(p, f"line {no}", "-", "expected a JSON object")
        lab = AnnotatedLabel.from_json(d, p, no)
        out[lab.qid] = lab
    return out


def apply_labels(conversations: list[Conversation], labels: dict[str, AnnotatedLabel]) -> list[Conversation]:
    """Copies of ``conversations`` whose questions carry the given primary/secondary labels
    (questions without a label keep theirs). The inputs are not modified."""
    out = []
    for c in conversations:
        qs = tuple(dataclasses.replace(q, capability=labels[q.id].primary, secondary=labels[q.id].secondary)
                   if q.id in labels else q for q in c.questions)
        out.append(dataclasses.replace(c, questions=qs))
    return out


LETTERS = tuple(CAPABILITY_NAMES)


def agreement(dataset: str, conversations: list[Conversation], labels: dict) -> dict:
    """``{"n", "matched", "primary_match_rate", "by_type": {type: {"native", "n", "matched",
    "rate"}}, "confusion": {native letter: {annotated letter: count}}, "fallbacks"}`` over the
    questions of ``conversations`` that have an annotator label in ``labels`` ({qid:
    AnnotatedLabel}); a fallback (the native label itself) is left out and counted in
    ``fallbacks`` (``primary_match_rate`` None when nothing is left)."""
    by_type: dict[str, dict] = {}
    confusion = {a: {b: 0 for b in LETTERS} for a in LETTERS}
    n = matched = fallbacks = 0
    for conv in conversations:
        for q in conv.questions:
            lab = labels.get(q.id)
            if lab is None:
                continue
            if lab.fallback:
                fallbacks += 1
                continue
            native = capability_for(dataset, q.category, q.id).value
            got = lab.primary.value
            name = LOCOMO_CATEGORY_NAMES.get(str(q.category), str(q.category)) if dataset == "locomo" else str(q.category)
            row = by_type.setdefault(f"{q.category} {name}" if dataset == "locomo" else name,
                                     {"native": native, "n": 0, "matched": 0})
            row["n"] += 1
            row["matched"] += native == got
            confusion[native][got] += 1
            n += 1
            matched += native == got
    for row in by_type.values():
        row["rate"] = row["matched"] / row["n"]
    return {"n": n, "matched": matched, "primary_match_rate": matched / n if n else None,
            "by_type": dict(sorted(by_type.items())), "confusion": confusion, "fallbacks": fallbacks}


def render_agreement(a: dict, title: str) -> str:
    """Markdown of :func:`agreement`: the per-type table, the overall rate, the confusion table."""
    out = [f"## {title}", "", "| benchmark type | native primary | questions | primary match | rate |",
           "|---|---|---|---|---|"]
    out += [f"| {t} | {r['native']} | {r['n']} | {r['matched']} | {r['rate']:.2%} |" for t, r in a["by_type"].items()]
    rate = "-" if a["primary_match_rate"] is None else f"{a['primary_match_rate']:.2%}"
    out += [f"| **all** | | **{a['n']}** | **{a['matched']}** | **{rate}** |", "",
            f"Questions whose annotator replies never validated (left out above; native label used, not saved, "
            f"asked again by a rerun): {a['fallbacks']}.", "",
            "Confusion (rows: native primary, columns: annotated primary; counts):", "",
            "| native \\ annotated | " + " | ".join(LETTERS) + " |", "|" + "---|" * (len(LETTERS) + 1)]
    out += [f"| {x} | " + " | ".join(str(a["confusion"][x][y]) for y in LETTERS) + " |" for x in LETTERS
            if any(a["confusion"][x].values())]
    return "\n".join(out) + "\n"
