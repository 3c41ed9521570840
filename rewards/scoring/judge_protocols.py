"""The benchmarks' official judge protocols, loaded at run time from
``$MEMGYM_DATA/judges/{longmemeval,beam,locomo_membuilder}.json`` (sources in that folder's
README.md) and applied as the cited code does: LongMemEval @ 9e0b455
``src/evaluation/evaluate_qa.py``, BEAM @ b2a3ee8 ``src/evaluation/compute_metrics.py``,
MemBuilder @ 422d053 ``eval/llm_judge.py``. Budgets the official code leaves to the API
default are :data:`DEFAULT_MAX_TOKENS`.

A protocol is trusted by content, not by name: ``official`` and ``corrected`` read the file
under ``$MEMGYM_DATA/judges`` only when its sha256 is the shipped one (:data:`OFFICIAL_SHA256`);
any other protocol text runs only as ``custom:<file>``, named with its sha256 in every report.
Raises :class:`JudgeProtocolError` naming the file (and key, or the hashes) for a missing,
broken or changed protocol, or a protocol name that is not offered.
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from memgym.llm.base import GenerationParams
from memgym.llm.errors import MemgymError
from memgym.llm.structured import JsonSchema

__all__ = ["PROTOCOLS", "OFFICIAL_SHA256", "JudgeProtocolError", "check_protocol", "judges_dir", "load_judge_file",
           "protocol_file", "protocol_identity", "official_file_problem",
           "longmemeval_messages", "longmemeval_params", "longmemeval_label",
           "beam_rubric_messages", "beam_rubric_params", "beam_parse_json", "beam_item_score",
           "beam_equivalence_messages", "beam_equivalence_label", "beam_system_list", "beam_event_ordering",
           "membuilder_messages", "membuilder_params", "membuilder_label", "JSON_OBJECT", "DEFAULT_MAX_TOKENS",
           "protocol_note", "protocol_card"]

#: ``judge_protocol`` values: ``official`` (every dataset, the default), ``corrected`` (BEAM only) and
#: ``custom:<file>`` (any dataset: that protocol file, under the official rules, never called official).
PROTOCOLS = ("official", "corrected", "custom:<file>")

#: memgym's token budgets where the official request sets none (the API default then applies).
DEFAULT_MAX_TOKENS = {"beam_rubric": 512, "beam_equivalence": 16, "membuilder": 256}

_FILES = {"longmemeval": "longmemeval.json", "beam": "beam.json", "locomo": "locomo_membuilder.json"}

#: sha256 of each protocol file as extracted from its source (``$MEMGYM_DATA/judges/README.md``).
OFFICIAL_SHA256 = {
    "longmemeval.json": "f2eda9e881532b464d4b3cce6f4cc04f395dbe7840768bce8fe186cc28b184fe",
    "beam.json": "f42a8fbe0c95880e9aa2d8bb844bbc104cf25d9d190163c0dc1e6e1710ad1d72",
    "locomo_membuilder.json": "2a3394fb422b4db6a9de61b4438120d9b55544fa84429f824dda42d9d06ec0dd",
}


class JudgeProtocolError(MemgymError, ValueError):
    """A judge protocol name is not offered, or its file is missing, broken or not the official
    text (``kind`` ``usage``: exit status 2; a missing file is ``data``: 1)."""

    kind = "usage"

    def __init__(self, message: str, kind: str = "usage"):
        super().__init__(message)
        self.kind = kind


def _custom_path(protocol: str) -> str | None:
    return protocol[len("custom:"):].strip() if protocol.startswith("custom:") else None


def check_protocol(dataset: str | None, protocol: str) -> str:
    """``protocol`` if ``dataset`` offers it (``corrected``: BEAM only; ``custom:<file>``: a file
    must be named, and a dataset whose judge it replaces); else JudgeProtocolError."""
    custom = _custom_path(protocol) if isinstance(protocol, str) else None
    if custom is not None:
        if not custom:
            raise JudgeProtocolError("judge_protocol custom:<file> needs the protocol file after 'custom:'")
        if dataset is not None and dataset not in _FILES:
            raise JudgeProtocolError(f"judge_protocol {protocol!r}: {dataset} has no benchmark judge to replace")
        return protocol
    if protocol not in ("official", "corrected"):
        raise JudgeProtocolError(f"judge_protocol must be official, corrected or custom:<file>, got {protocol!r}")
    if protocol == "corrected" and dataset != "beam":
        raise JudgeProtocolError(f"judge_protocol 'corrected' exists for beam only (it fills BEAM's <question> and "
                                 f"keeps its 0.5 scores); {dataset or 'this dataset'} has only 'official'")
    return protocol


def judges_dir() -> Path:
    """``$MEMGYM_DATA/judges`` (see :func:`memgym.data_synth.paths.data_root`)."""
    from memgym.data_synth.paths import data_root
    return data_root() / "judges"


def protocol_file(dataset: str, protocol: str = "official") -> Path:
    """The file ``protocol`` reads for ``dataset``: ``judges/<file>`` for official and corrected,
    the named file for ``custom:<file>``. Raises JudgeProtocolError (unknown dataset)."""
    if dataset not in _FILES:
        raise JudgeProtocolError(f"no judge protocol file for dataset {dataset!r}; expected one of {', '.join(_FILES)}")
    custom = _custom_path(protocol)
    return Path(custom).expanduser() if custom else judges_dir() / _FILES[dataset]


_LOADED: dict[tuple[str, int, int], tuple[dict, str]] = {}


def _read(path: Path) -> tuple[dict, str]:
    """(parsed JSON object, sha256 hex) of ``path``, cached per path, mtime and size."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise JudgeProtocolError(f"judge protocol file not found: {path} (set MEMGYM_DATA to the data folder that "
                                 f"holds judges/, or name an existing file after custom:)", kind="data") from None
    from memgym.llm.runcard import record_input

    record_input(path, "judge protocol", data_root=judges_dir().parent)
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _LOADED:
        raw = path.read_bytes()
        try:
            data = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise JudgeProtocolError(f"judge protocol file {path}: not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise JudgeProtocolError(f"judge protocol file {path}: expected a JSON object")
        _LOADED[key] = (data, hashlib.sha256(raw).hexdigest())
    return _LOADED[key]


def protocol_card(dataset: str | None, protocol: str, scorer: str | None) -> dict:
    """The run card's judge entry: the scorer, the protocol name and, for the LLM judge
    (``scorer`` ``llm``) of a dataset with a protocol file, that file and its sha256 (None when
    missing); offline scorers and F1 read no file."""
    from memgym.llm.runcard import file_sha256

    path = protocol_file(dataset, protocol) if scorer == "llm" and dataset in _FILES else None
    return {"scorer": scorer, "judge_protocol": protocol, "file": str(path) if path else None,
            "sha256": file_sha256(path) if path else None}


def official_file_problem(dataset: str) -> str:
    """Why ``judges/<file>`` of ``dataset`` is not the official protocol ("" when it is): one line
    naming the file, the expected and the actual sha256. Raises JudgeProtocolError (missing or
    unreadable file)."""
    path = protocol_file(dataset)
    _, sha = _read(path)
    want = OFFICIAL_SHA256[_FILES[dataset]]
    if sha == want:
        return ""
    return (f"judge protocol file {path} is not the official {dataset} protocol: sha256 {sha}, expected {want}; "
            f"a changed protocol runs only as judge_protocol custom:{path}")


def load_judge_file(dataset: str, protocol: str = "official") -> dict:
    """The parsed protocol file of ``dataset`` under ``protocol`` (official and corrected: only
    when its sha256 is :data:`OFFICIAL_SHA256`'s). Raises JudgeProtocolError (unknown dataset,
    missing file, not a JSON object, a changed official file)."""
    check_protocol(dataset, protocol)
    path = protocol_file(dataset, protocol)
    data, _ = _read(path)
    if _custom_path(protocol) is None:
        problem = official_file_problem(dataset)
        if problem:
            raise JudgeProtocolError(problem)
    return data


def protocol_identity(dataset: str | None, protocol: str) -> str:
    """``protocol`` as a cache identity: a custom protocol by its file's sha256, not its path."""
    if _custom_path(protocol) is None or dataset is None:
        return protocol
    return f"custom@{_read(protocol_file(dataset, protocol))[1]}"


def _get(dataset: str, *keys: str, protocol: str = "official"):
    node = load_judge_file(dataset, protocol)
    for i, k in enumerate(keys):
        if not isinstance(node, dict) or k not in node:
            raise JudgeProtocolError(f"judge protocol file {protocol_file(dataset, protocol)}: no key "
                                     f"{'.'.join(keys[: i + 1])!r}")
        node = node[k]
    return node


def protocol_note(dataset: str | None, protocol: str) -> str:
    """One line naming the protocol behind a number, with its source (for reports); a custom
    protocol by its file and sha256, never as official."""
    custom = _custom_path(protocol)
    if custom is not None and dataset in _FILES:
        path = protocol_file(dataset, protocol)
        return (f"{dataset} CUSTOM judge protocol {path} (sha256 {_read(path)[1][:16]}), not the benchmark's official "
                f"one: its numbers are not comparable with published ones")
    if dataset == "beam":
        src = _get("beam", "source", protocol=protocol)
        what = ("official (the benchmark's code as is: '<question>' left unfilled, int() of each item score)"
                if protocol == "official" else "corrected (question filled in, 0.5 kept; everything else official)")
        return f"BEAM {what}; {src['repository']} @ {src['commit'][:7]}"
    if dataset == "longmemeval":
        src = _get("longmemeval", "source")
        return f"LongMemEval official; {src['repository']} @ {src['commit'][:7]}"
    if dataset == "locomo":
        src = _get("locomo", "source")
        return f"LoCoMo llm = MemBuilder's CORRECT/WRONG judge; {src['repository']} @ {src['commit'][:7]}"
    return "memgym's own CORRECT/WRONG judge (no benchmark protocol)"


# ------------------------------------------------------------------ LongMemEval


def longmemeval_messages(question_type: str, question: str, answer: str, response: str,
                         question_id: str | None, protocol: str = "official") -> list[dict]:
    """LongMemEval's one user message (``abstention`` template for ``_abs`` ids). Raises
    JudgeProtocolError when the type has no template.
    """
    templates = _get("longmemeval", "templates", protocol=protocol)
    key = "abstention" if question_id is not None and "_abs" in question_id else question_type
    if key not in templates:
        raise JudgeProtocolError(f"LongMemEval has no judge template for question type {question_type!r} "
                                 f"(known: {', '.join(t for t in templates if t != 'abstention')})")
    return [{"role": "user", "content": templates[key].format(question, answer, response)}]


def longmemeval_params(protocol: str = "official") -> GenerationParams:
    """The official request settings (temperature 0, ``max_tokens`` 10)."""
    req = _get("longmemeval", "request", protocol=protocol)
    return GenerationParams(max_new_tokens=int(req["max_tokens"]), temperature=float(req["temperature"]))


def longmemeval_label(reply: str) -> bool:
    """The official reply rule: ``'yes' in reply.strip().lower()`` (so "Eyes" is a yes)."""
    return "yes" in reply.strip().lower()


# ------------------------------------------------------------------ BEAM


def beam_rubric_messages(question: str, item: str, response: str, protocol: str = "official") -> list[dict]:
    """The rubric prompt as the whole input (one user message). ``official`` replaces only
    ``<rubric_item>`` then ``<llm_response>`` (the official code); ``corrected`` first fills
    ``<question>``; ``custom:<file>`` is read as official."""
    prompt = _get("beam", "rubric_prompt", protocol=protocol)
    if protocol == "corrected":
        prompt = prompt.replace("<question>", question)
    return [{"role": "user", "content": prompt.replace("<rubric_item>", item).replace("<llm_response>", response)}]


def beam_rubric_params() -> GenerationParams:
    """Temperature 0 (the official ``src/llm.py``); ``max_tokens``: memgym's (none officially)."""
    return GenerationParams(max_new_tokens=DEFAULT_MAX_TOKENS["beam_rubric"], temperature=0.0)


_FENCE = re.compile(r"```(?:json)?\s*(\[.*\]|\{.*\})\s*```", re.DOTALL)
_FIRST_JSON = re.compile(r"(\{.*?\}|\[.*?\])", re.DOTALL)


def beam_parse_json(reply: str):
    """``parse_json_response`` of the official code: strip; a reply that starts with a code
    fence gives its fenced JSON; ``json.loads``; else the first ``{...}`` or ``[...]`` (lazy
    regex); else ``json_repair``. Raises ValueError when nothing parses."""
    text = reply.strip()
    if text.startswith("```"):
        m = _FENCE.search(text)
        if m:
            text = m.group(1).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    m = _FIRST_JSON.search(text)
    if m:
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError:
            pass
    import json_repair
    value = json_repair.loads(text)
    if value in ("", None):
        raise ValueError("No valid JSON found in response.")
    return value


def beam_item_score(reply: str, protocol: str = "official") -> float | None:
    """One rubric item's score: ``official`` (and ``custom:``) int, ``corrected`` float of
    ``response['score']``; None where the official code would raise.
    """
    try:
        obj = beam_parse_json(reply)
        value = obj["score"]
        if isinstance(value, bool):
            value = int(value)
        return float(value) if protocol == "corrected" else float(int(value))
    except Exception:  # what the official code would raise on: counted, scored 0
        return None


def _fstring_template(source: str, names: tuple[str, ...]) -> str:
    """A ``str.format`` template from the source text of a Python f-string whose fields are
    the bare ``names`` (escapes decoded by the Python parser, nothing evaluated)."""
    tree = ast.parse(source, mode="eval").body
    if not isinstance(tree, ast.JoinedStr):
        raise JudgeProtocolError(f"BEAM equivalence user message: expected an f-string, got {source[:60]!r}")
    parts = []
    for node in tree.values:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value.replace("{", "{{").replace("}", "}}"))
        elif isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Name) and node.value.id in names \
                and node.conversion == -1 and node.format_spec is None:
            parts.append("{" + node.value.id + "}")
        else:
            raise JudgeProtocolError(f"BEAM equivalence user message: unexpected field in {source[:60]!r}")
    return "".join(parts)


def beam_equivalence_messages(first: str, second: str, protocol: str = "official") -> list[dict]:
    """``llm_equivalence(first_paragraph=reference item, second_paragraph=answer line)``: the
    system message and the f-string user message of the official code."""
    eo = _get("beam", "event_ordering", protocol=protocol)
    user = _fstring_template(eo["equivalence_user_message_fstring"], ("first_paragraph", "second_paragraph"))
    return [{"role": "system", "content": eo["equivalence_system_message"]},
            {"role": "user", "content": user.format(first_paragraph=first, second_paragraph=second)}]


def beam_equivalence_label(reply: str) -> bool:
    """The official rule ``'yes' in reply.lower()``."""
    return "yes" in reply.lower()


def beam_system_list(response: str) -> list[str]:
    """The answer's items as the official code takes them: ``response.split('\\n')`` (blank
    lines kept)."""
    return response.split("\n")


def beam_event_ordering(reference: list[str], system_canon: list[str]) -> dict:
    """BEAM ``event_ordering_score`` after alignment: ``{"precision", "recall", "f1", "tau_norm",
    "final_score"}``, tau_norm = (tau_b + 1) / 2 over the union's ranks (NaN when undefined).
    """
    from scipy.stats import kendalltau

    tp = len(set(reference) & set(system_canon))
    fp = len([x for x in system_canon if x not in reference])
    fn = len([x for x in reference if x not in system_canon])
    precision = tp / (tp + fp) if tp + fp else 0
    recall = tp / (tp + fn) if tp + fn else 0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0
    union = list(dict.fromkeys(list(reference) + list(system_canon)))
    tie_rank = len(union) + 1

    def to_rank(seq):
        r = {item: i + 1 for i, item in enumerate(seq)}
        return [r.get(u, tie_rank) for u in union]

    import warnings
    with warnings.catch_warnings():  # scipy warns on a constant input; the NaN is the result
        warnings.simplefilter("ignore")
        tau = kendalltau(to_rank(reference), to_rank(system_canon), variant="b", method="auto").statistic
    tau_norm = (float(tau) + 1) / 2 if tau is not None else math.nan
    return {"precision": precision, "recall": recall, "f1": f1, "tau_norm": tau_norm, "final_score": tau_norm * f1}


# ------------------------------------------------------------------ LoCoMo (MemBuilder)


@dataclass(frozen=True, eq=False)
class _JsonObject(JsonSchema):
    """OpenAI's JSON mode (``response_format={"type": "json_object"}``); other backends get
    the schema ``{"type": "object"}``."""

    def response_format(self) -> dict:
        return {"type": "json_object"}


#: MemBuilder's ``response_format``.
JSON_OBJECT = _JsonObject("json_object", {"type": "object"})


def membuilder_messages(question: str, gold: str, generated: str, protocol: str = "official") -> list[dict]:
    """MemBuilder's ACCURACY_PROMPT filled by ``str.format``, one user message."""
    prompt = _get("locomo", "prompt", protocol=protocol)
    return [{"role": "user", "content": prompt.format(question=question, gold_answer=gold, generated_answer=generated)}]


def membuilder_params(protocol: str = "official") -> GenerationParams:
    """Temperature 0.0 (MemBuilder's request); ``max_tokens``: memgym's (none officially)."""
    req = _get("locomo", "request", protocol=protocol)
    return GenerationParams(max_new_tokens=DEFAULT_MAX_TOKENS["membuilder"], temperature=float(req["temperature"]))


_FENCES = re.compile(r"^```(?:json)?\s*|\s*```$")
_FLAT_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def membuilder_label(reply: str) -> tuple[float, bool]:
    """``(score, readable)`` by MemBuilder's ``LLMJudge._extract_json`` + ``evaluate``;
    ``readable`` is False when neither a JSON label nor either word was found.
    """
    clean = _FENCES.sub("", reply.strip())
    m = _FLAT_OBJECT.search(clean)
    up = reply.upper()
    try:
        obj = json.loads(m.group(0) if m else clean)
        label = obj.get("label", "WRONG")
        return (1.0 if label == "CORRECT" else 0.0), "label" in obj or "CORRECT" in up or "WRONG" in up
    except Exception:  # JSONDecodeError and the rest: the official text fallback
        return (1.0 if "CORRECT" in up and "WRONG" not in up else 0.0), ("CORRECT" in up or "WRONG" in up)
