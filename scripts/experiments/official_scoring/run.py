"""The official-scoring experiment: an independent check of memgym's official scoring.

A second implementation of each benchmark's official scoring, written from the benchmarks' code
semantics (LongMemEval ``evaluate_qa.py`` + ``print_qa_metrics.py``; BEAM ``compute_metrics.py``
+ ``report_results.py``; MemBuilder ``eval/llm_judge.py``) and the protocol files alone: it builds
its own requests from ``$MEMGYM_DATA/judges/*.json`` (BEAM's equivalence message by evaluating
the official f-string source itself), asks the same deterministic fake judge, parses replies,
aligns, ranks (its own Kendall tau-b, no scipy) and aggregates without any memgym scoring code.
memgym's side runs ``memgym.rewards.scoring.predictions.score_predictions`` with the same judge. The judge's reply
is a function of the exact request text (a hash), so any difference in a prompt changes the
numbers.

Usage: ``python scripts/experiments/official_scoring/run.py [--n 40]``; prints both results side by side
and exits 1 on any difference (|a - b| > 1e-12 or NaN vs number).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


# ------------------------------------------------------------------ the fake judge (shared by both sides)


def _pick(text: str, options: list[str]) -> str:
    return options[int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16) % len(options)]


def fake_judge(messages: list[dict]) -> str:
    user = messages[-1]["content"]
    if messages[0]["role"] == "system":  # BEAM equivalence: same text -> YES, else mostly NO
        m = re.match(r"First snippet: (.*) \n\n {23}Second snippet: (.*)\n {20}$", user, re.DOTALL)
        if m and m.group(1).strip() == m.group(2).strip():
            return "YES"
        return _pick(user, ["NO", "NO", "NO", "no.", "**YES**"])
    if "Is the model response correct?" in user or "correctly identify the question as unanswerable" in user:
        return _pick(user, ["yes", "no", "Yes.", "Eyes", "nope", "No"])
    if "RUBRIC CRITERION" in user:
        return _pick(user, ['{"score": 1}', '{"score": 0.5, "reason": "partly"}', '{"score": 0.0}',
                            '```json\n{"score": 1.0, "reason": "ok"}\n```', 'Result: {"score": "1"} done', "garbage",
                            '{"score": "0.5"}'])
    return _pick(user, ['{"label": "CORRECT"}', '{"label": "WRONG"}', "CORRECT", "garbage", "CORRECT, not WRONG",
                        '```json\n{"label": "CORRECT"}\n```'])


class FakeBackend:
    model_id = "fake-judge"
    calls = 0

    def generate(self, batch, params, schemas=None):
        from memgym.llm.base import Completion
        return [Completion(text=fake_judge(m), prompt_tokens=1, completion_tokens=1) for m in batch]


# ------------------------------------------------------------------ the independent implementations


def _judges() -> Path:
    from memgym.data_synth.paths import data_root
    return data_root() / "judges"


def lme_independent(questions, preds) -> dict:
    d = json.loads((_judges() / "longmemeval.json").read_text(encoding="utf-8"))
    logs = []
    for q in questions:
        if q.id not in preds:
            continue
        t = "abstention" if "_abs" in q.id else q.category
        prompt = d["templates"][t].format(q.question, q.answer, preds[q.id])
        reply = fake_judge([{"role": "user", "content": prompt}])
        logs.append((q.id, q.category, "yes" in reply.strip().lower()))
    by_type = defaultdict(list)
    for _, t, lab in logs:
        by_type[t].append(1 if lab else 0)
    task_acc = [sum(v) / len(v) for v in by_type.values()]
    abst = [1 if lab else 0 for qid, _, lab in logs if "_abs" in qid]
    return {"task_averaged": sum(task_acc) / len(task_acc), "overall": sum(1 for *_, lab in logs if lab) / len(logs),
            "abstention": sum(abst) / len(abst) if abst else None}


def _beam_parse_json(response: str):
    response = response.strip()
    if response.startswith("```"):
        match = re.search(r"```(?:json)?\s*(\[.*\]|\{.*\})\s*```", response, re.DOTALL)
        if match:
            response = match.group(1).strip()
    try:
        return json.loads(response)
    except json.JSONDecodeError:
        pass
    match = re.search(r"(\{.*?\}|\[.*?\])", response, re.DOTALL)
    if match:
        return json.loads(match.group(1))
    raise ValueError("No valid JSON found in response.")


def _tau_b(x, y) -> float:
    conc = disc = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            a, b = x[i] - x[j], y[i] - y[j]
            if a == 0 and b == 0:
                continue
            if a == 0:
                tx += 1
            elif b == 0:
                ty += 1
            elif a * b > 0:
                conc += 1
            else:
                disc += 1
    den = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return (conc - disc) / den if den else math.nan


def beam_independent(convs, preds, protocol: str) -> dict:
    d = json.loads((_judges() / "beam.json").read_text(encoding="utf-8"))
    eo = d["event_ordering"]
    src = eo["equivalence_user_message_fstring"]
    per = defaultdict(lambda: defaultdict(list))
    for c in convs:
        for q in c.questions:
            if q.id not in preds:
                continue
            resp = preds[q.id]
            if q.category == "event_ordering":
                reference, used, system = list(q.rubric), set(), []
                for s in resp.split("\n"):
                    hit = None
                    for idx, r in enumerate(reference):
                        if idx in used:
                            continue
                        user = eval(src, {}, {"first_paragraph": r, "second_paragraph": s})  # the official f-string
                        reply = fake_judge([{"role": "system", "content": eo["equivalence_system_message"]},
                                            {"role": "user", "content": user}])
                        if "yes" in reply.lower():
                            hit = idx
                            break
                    if hit is None:
                        system.append(s)
                    else:
                        system.append(reference[hit])
                        used.add(hit)
                union = list(dict.fromkeys(reference + system))
                tie = len(union) + 1

                def rank(seq):
                    r = {item: i + 1 for i, item in enumerate(seq)}
                    return [r.get(u, tie) for u in union]

                tau = _tau_b(rank(reference), rank(system))
                score = (tau + 1) / 2
            else:
                total = 0.0
                for item in q.rubric:
                    prompt = d["rubric_prompt"]
                    if protocol == "corrected":
                        prompt = prompt.replace("<question>", q.question)
                    prompt = prompt.replace("<rubric_item>", item).replace("<llm_response>", resp)
                    reply = fake_judge([{"role": "user", "content": prompt}])
                    try:
                        v = _beam_parse_json(reply)["score"]
                        total += int(v) if protocol == "official" else float(v)
                    except Exception:
                        pass  # memgym's documented choice for what the official code raises on: 0
                score = total / len(q.rubric) if q.rubric else 0.0
            per[c.id][q.category].append(score)
    over = defaultdict(list)
    for chat in per.values():
        for a, v in chat.items():
            v = [x for x in v if not math.isnan(x)]
            if v:
                over[a].append(sum(v) / len(v))
    by_ability = {a: sum(v) / len(v) for a, v in over.items()}
    return {"by_ability": by_ability, "overall": sum(by_ability.values()) / len(by_ability)}


def locomo_independent(questions, preds) -> dict:
    d = json.loads((_judges() / "locomo_membuilder.json").read_text(encoding="utf-8"))
    labels = []
    for q in questions:
        if q.id not in preds:
            continue
        prompt = d["prompt"].format(question=q.question, gold_answer=q.answer, generated_answer=preds[q.id])
        text = fake_judge([{"role": "user", "content": prompt}])
        try:
            clean = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
            m = re.search(r"\{[^{}]*\}", clean, re.DOTALL)
            result = json.loads(m.group(0) if m else clean)
            labels.append(1 if result.get("label", "WRONG") == "CORRECT" else 0)
        except Exception:
            up = text.upper()
            labels.append(1 if "CORRECT" in up and "WRONG" not in up else 0)
    return {"overall": sum(labels) / len(labels)}


# ------------------------------------------------------------------ the comparison


def _predictions(convs, n: int) -> dict[str, str]:
    out = {}
    for c in convs:
        for q in c.questions:
            if len(out) >= n:
                return out
            if q.category == "event_ordering":
                items = list(q.rubric)
                k = len(out) % 3
                lines = (items[::-1] if k == 0 else ["Here is the order:", *items] if k == 1
                         else [items[0], "", *items[2:], "A trip to Rome", items[1]])
                out[q.id] = "\n".join(lines)
            else:
                out[q.id] = f"I think: {str(q.answer)[:40]}\nThat is all." if len(out) % 2 else "I do not know."
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-12


def run(n: int = 40, out=print) -> bool:
    from memgym.data_synth.datasets import load_conversations
    from memgym.rewards.scoring.scorers import make_scorer
    from memgym.rewards.scoring.predictions import score_predictions

    ok = True
    cases = [("longmemeval", "official", dict(split="test")), ("beam", "official", dict(ids=["100K-3", "100K-4"])),
             ("beam", "corrected", dict(ids=["100K-3", "100K-4"])), ("locomo", "official", dict(ids=["conv-26"]))]
    for dataset, protocol, sel in cases:
        convs = load_conversations(dataset, None, **sel)
        preds = _predictions(convs, n if dataset != "beam" else 10 ** 6)
        qs = [q for c in convs for q in c.questions]
        if dataset == "longmemeval":
            ind = lme_independent(qs, preds)
        elif dataset == "beam":
            ind = beam_independent(convs, preds, protocol)
        else:
            ind = locomo_independent(qs, preds)
        rep = score_predictions(dataset, convs, {k: {"prediction": v, "context": None, "line": 0}
                                                 for k, v in preds.items()},
                                make_scorer("llm", FakeBackend(), dataset=dataset, judge_protocol=protocol),
                                judge_protocol=protocol)
        mine = {k: rep[k] for k in ind}
        same = _same(ind, mine)
        ok &= same
        out(f"{dataset:12s} {protocol:9s} judged {rep['judged']:4d}  requests {rep['judge_calls']['prompts']:5d}  "
            f"{'AGREE' if same else 'DIFFER'}")
        out(f"    independent: {json.dumps(ind, sort_keys=True)}")
        out(f"    memgym:      {json.dumps(mine, sort_keys=True)}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="predictions per LoCoMo / LongMemEval case (BEAM: all)")
    args = ap.parse_args(argv)
    return 0 if run(args.n) else 1


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    sys.exit(main())
