"""The token ledger of an evolution run: model calls and tokens per role and round, budgets.

Source: docs/design.md § "Run state". Roles: ``coder``, ``extract`` / ``plan`` / ``answer`` (the
runner's task-LLM stages), ``extractor`` (a trained extractor), ``judge``, ``embed`` (calls only),
``annotator`` (capability labels, booked on round "0"). Cache hits cost nothing. A budget caps a
role's prompt + completion tokens (calls for ``embed``). Cost as the field reports it (PrisMem,
arXiv 2610.06361): :func:`tokens_by_round` and :func:`per_question`, the summary's cost keys
(:func:`cost_summary`) and report.md's token table (:func:`cost_section`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

ROLES = ("coder", "extract", "plan", "answer", "extractor", "judge", "annotator", "embed")
TASK_STAGES = ("extract", "plan", "answer")
TABLE_ROLES = ("coder", "task", "extractor", "judge", "annotator")
"""Columns of the per-round table: the coder, the task model (its stages summed), a trained
extractor, the judge, the annotator."""


class BudgetExhausted(RuntimeError):
    """A role used up its budget; ``role``, ``used``, ``budget`` say which and how much."""

    def __init__(self, role: str, used: int, budget: int):
        super().__init__(f"budget of role {role!r} exhausted: {used} >= {budget}")
        self.role, self.used, self.budget = role, used, budget


@dataclass
class Ledger:
    """``rounds``: round number (str, "0" = seed/setup, "final" = test) → role →
    ``{"calls", "prompt", "completion"}``, plus ``"estimated"``: how many of those calls' token
    counts are tokenizer estimates (the server's or the recording's counts were missing or
    invalid, :func:`memgym.llm.base.token_count_problem`; absent when none). ``budgets``: role →
    token cap (None = none)."""

    rounds: dict = field(default_factory=dict)
    budgets: dict = field(default_factory=dict)

    def add(self, round_key, role: str, calls: int = 0, prompt: int = 0, completion: int = 0,
            estimated: int = 0) -> None:
        """Book usage to ``role`` in ``round_key`` (ValueError for an unknown role or a
        negative count)."""
        if role not in ROLES:
            raise ValueError(f"unknown ledger role {role!r}; expected one of {', '.join(ROLES)}")
        if min(calls, prompt, completion, estimated) < 0:
            raise ValueError(f"negative usage for role {role!r}: {calls} calls, {prompt} prompt, {completion} "
                             f"completion tokens, {estimated} estimated")
        r = self.rounds.setdefault(str(round_key), {})
        row = r.setdefault(role, {"calls": 0, "prompt": 0, "completion": 0})
        row["calls"] += int(calls)
        row["prompt"] += int(prompt)
        row["completion"] += int(completion)
        if estimated:
            row["estimated"] = row.get("estimated", 0) + int(estimated)

    def add_usage(self, round_key, usage: dict) -> None:
        """Book a usage dict ``{role: {"calls", "prompt", "completion"[, "estimated"]}}``."""
        for role, u in usage.items():
            self.add(round_key, role, u.get("calls", 0), u.get("prompt", 0), u.get("completion", 0),
                     u.get("estimated", 0))

    def totals(self) -> dict:
        """role → summed ``{"calls", "prompt", "completion"}`` over all rounds."""
        out = defaultdict(lambda: {"calls": 0, "prompt": 0, "completion": 0})
        for r in self.rounds.values():
            for role, u in r.items():
                for k in ("calls", "prompt", "completion"):
                    out[role][k] += u[k]
        return {k: dict(v) for k, v in out.items()}

    def estimated(self) -> dict:
        """role → calls whose token counts are estimates, over all rounds (roles with none left out)."""
        out: dict = defaultdict(int)
        for r in self.rounds.values():
            for role, u in r.items():
                out[role] += u.get("estimated", 0)
        return {k: v for k, v in out.items() if v}

    def used(self, role: str) -> int:
        """Tokens used by ``role`` (calls for ``embed``)."""
        t = self.totals().get(role, {"calls": 0, "prompt": 0, "completion": 0})
        return t["calls"] if role == "embed" else t["prompt"] + t["completion"]

    def check(self) -> None:
        """Raise :class:`BudgetExhausted` for the first role at or over its budget."""
        for role, cap in self.budgets.items():
            if cap is not None and self.used(role) >= cap:
                raise BudgetExhausted(role, self.used(role), cap)

    def round_tokens(self, round_key) -> int:
        """Prompt + completion tokens of every role in one round."""
        return sum(u["prompt"] + u["completion"] for u in self.rounds.get(str(round_key), {}).values())

    def to_json(self) -> dict:
        return {"rounds": self.rounds, "budgets": self.budgets}

    @classmethod
    def from_json(cls, d: dict) -> "Ledger":
        return cls({k: {r: dict(u) for r, u in v.items()} for k, v in d["rounds"].items()}, dict(d["budgets"]))


def usage_from_eval(ev) -> dict:
    """Ledger usage of one :class:`~memgym.evolution.execution.results.ProgramEvaluation`: task-LLM
    calls split by stage (extract, plan, answer; tokens apportioned by call share), the
    extractor, judge and embed roles from the runtime counts."""
    out = {}
    task_calls = ev.model_calls.get("task", 0)
    task_tok = ev.tokens.get("task", {"prompt": 0, "completion": 0})
    stage_calls = {s: ev.stage_llm_calls.get(s, 0) for s in ("extract", "plan", "answer")}
    total = sum(stage_calls.values())
    estimated = task_tok.get("estimated", 0)  # calls with estimated counts: marked on the stages in order
    for s, n in stage_calls.items():
        if n:
            share = n / total if total else 0.0
            out[s] = {"calls": n, "prompt": round(task_tok["prompt"] * share),
                      "completion": round(task_tok["completion"] * share)}
            if estimated:
                out[s]["estimated"], estimated = min(n, estimated), estimated - min(n, estimated)
    if task_calls and not total:  # program toolkit.llm calls: booked to answer
        out["answer"] = {"calls": task_calls, **task_tok}
    for role in ("extractor", "judge"):
        if ev.model_calls.get(role):
            out[role] = {"calls": ev.model_calls[role], **ev.tokens.get(role, {"prompt": 0, "completion": 0})}
    if ev.model_calls.get("embed"):
        out["embed"] = {"calls": ev.model_calls["embed"], "prompt": 0, "completion": 0}
    return out


def _tok(u: dict) -> int:
    return int(u.get("prompt", 0)) + int(u.get("completion", 0))


def role_tokens(usage: dict) -> dict:
    """``{column: tokens}`` over :data:`TABLE_ROLES` (+ ``total``) of one usage dict
    ``{role: {"calls", "prompt", "completion"}}``; ``task`` sums the task model's stages."""
    out = {r: _tok(usage.get(r, {})) for r in TABLE_ROLES if r != "task"}
    out["task"] = sum(_tok(usage.get(s, {})) for s in TASK_STAGES)
    out = {r: out[r] for r in TABLE_ROLES}
    out["total"] = sum(out.values())
    return out


def tokens_by_round(ledger: Ledger) -> dict:
    """``{"rounds": {round: {column: tokens, "total"}}, "run": {column: tokens, "total"}}``:
    rounds in order ("0" = seed and labels, 1..N, "final" = the test runs), the run = their sum."""
    def order(k):
        return (0, int(k)) if str(k).isdigit() else (1, 0)

    rounds = {k: role_tokens(ledger.rounds[k]) for k in sorted(ledger.rounds, key=order)}
    run = {c: sum(r[c] for r in rounds.values()) for c in (*TABLE_ROLES, "total")}
    return {"rounds": rounds, "run": run}


def per_question(usage: dict, n_questions: int) -> dict:
    """Tokens per test question of one evaluation's usage (``{column: float}``, columns as
    :func:`role_tokens`); {} when ``n_questions`` is 0."""
    if not n_questions:
        return {}
    return {k: v / n_questions for k, v in role_tokens(usage).items()}


def label_usage(labels: str, splits: dict) -> dict:
    """The ``annotator`` usage of a run's capability labels: the tokens (and calls: attempts)
    recorded in the label file ``labels`` for the train and valid questions of ``splits``
    (``{split: [Conversation]}``); {} for ``native``. Booked on round "0"."""
    if labels == "native":
        return {}
    from memgym.data_synth.annotate import load_labels

    got = load_labels(labels)
    qids = {q.id for s in ("train", "valid") for c in splits.get(s, []) for q in c.questions}
    used = [got[q] for q in sorted(qids) if q in got]
    return {"annotator": {"calls": sum(x.attempts for x in used), "prompt": sum(x.prompt_tokens for x in used),
                          "completion": sum(x.completion_tokens for x in used)}}


def cost_summary(state, fin: dict) -> dict:
    """The summary's cost keys (module doc)."""
    final_test = fin.get("final_test") or {}
    n = len(final_test.get("tasks") or {})
    return {"tokens_by_round": tokens_by_round(state.ledger),
            "test_tokens_per_question": per_question(fin.get("final_test_usage") or {}, n),
            "test_questions": n, "budgets": {r: b for r, b in state.ledger.budgets.items() if b is not None},
            "estimated_calls": state.ledger.estimated()}


def _k(v) -> str:
    """Tokens for a table: 1234 -> "1,234"; 12_345_678 -> "12.35M"; floats to 0.1."""
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v / 1e6:.2f}M" if v >= 10_000_000 else f"{v:,}"


def cost_section(summary: dict) -> list[str]:
    """report.md's token table: one row per round (0 = seed and labels, final = test runs)."""
    tb = summary.get("tokens_by_round")
    if not tb:
        return []
    out = ["### Tokens per role per round (prompt + completion; cache hits cost 0)", "",
           "| round | " + " | ".join(TABLE_ROLES) + " | total |", "|" + "---|" * (len(TABLE_ROLES) + 2)]
    for r, row in tb["rounds"].items():
        out.append(f"| {r} | " + " | ".join(_k(row[c]) for c in TABLE_ROLES) + f" | {_k(row['total'])} |")
    out.append("| **run** | " + " | ".join(f"**{_k(tb['run'][c])}**" for c in TABLE_ROLES)
               + f" | **{_k(tb['run']['total'])}** |")
    pq = summary.get("test_tokens_per_question") or {}
    if pq:
        out.append(f"| per test question (frozen program, {summary['test_questions']} questions) | "
                   + " | ".join(_k(pq[c]) for c in TABLE_ROLES) + f" | {_k(pq['total'])} |")
    out += ["", "`task` = the task model's extract + plan + answer calls; PrisMem reports 73.7M tokens per "
                "20-round BEAM run (M* 76.5M) and 100.59K task tokens per BEAM-1M test question."]
    est = summary.get("estimated_calls") or {}
    if est:
        out.append("- **estimated token counts**: " + ", ".join(f"{r} {n:,} call{'s' * (n != 1)}" for r, n in est.items())
                   + " (the server's or the recording's counts were missing or invalid, so they were counted with the "
                     "SmolLM2 tokenizer)")
    budgets = summary.get("budgets") or {}
    out.append("- budgets: " + (", ".join(f"{r} {b:,} tokens" for r, b in budgets.items()) if budgets else "none")
               + (f"; **the run ended early: {summary['stopped']}**" if summary.get("stopped") else ""))
    return out
