"""Agreement of capability labels with the native benchmark-type mapping, as PrisMem
(``shared/seeds/000_0e559b88b400976a.txt``) reports for BEAM-1M: per native type, the share of
annotated primaries equal to :func:`data_synth.capabilities.capability_for`'s, and the confusion
table native (rows) x annotated (columns)."""
from __future__ import annotations

from data_synth.capabilities import LOCOMO_CATEGORY_NAMES, capability_for
from memory_bank.schema import CAPABILITY_NAMES, Conversation

LETTERS = tuple(CAPABILITY_NAMES)


def agreement(dataset: str, conversations: list[Conversation], labels: dict) -> dict:
    """``{"n", "matched", "primary_match_rate", "by_type": {type: {"native", "n", "matched",
    "rate"}}, "confusion": {native letter: {annotated letter: count}}, "fallbacks"}`` over the
    questions of ``conversations`` that have a label in ``labels`` ({qid: AnnotatedLabel})."""
    by_type: dict[str, dict] = {}
    confusion = {a: {b: 0 for b in LETTERS} for a in LETTERS}
    n = matched = fallbacks = 0
    for conv in conversations:
        for q in conv.questions:
            lab = labels.get(q.id)
            if lab is None:
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
            fallbacks += bool(lab.fallback)
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
            f"Annotator replies that never validated (native label kept, flagged): {a['fallbacks']}.", "",
            "Confusion (rows: native primary, columns: annotated primary; counts):", "",
            "| native \\ annotated | " + " | ".join(LETTERS) + " |", "|" + "---|" * (len(LETTERS) + 1)]
    out += [f"| {x} | " + " | ".join(str(a["confusion"][x][y]) for y in LETTERS) + " |" for x in LETTERS
            if any(a["confusion"][x].values())]
    return "\n".join(out) + "\n"
