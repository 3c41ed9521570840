"""Reports of an evolution run: ``summary.json`` (a contract), ``report.md`` (one row
per round), ``capabilities.png`` (valid score of each capability's specialist by round,
PrisMem Fig. 3a) and ``boundary.png`` (per capability the peak valid score of any program vs the
frozen program's, PrisMem Fig. 3b).

summary.json::

    {"rounds": int, "candidates_evaluated": int, "proposals_failed": int, "wall_s": float,
     "model_calls": {role: int}, "tokens": {role: {"prompt": int, "completion": int}},
     "seed":  {"valid": SCORES, "test": SCORES or null},
     "final": {"valid": SCORES, "test": SCORES or null, "program": "<path of best.py>"},
     "specialists": {"F"|"T"|"P"|"M"|"A": {"valid": SCORES, "program": "<path>"}}}
    SCORES = {"overall": float, "by_capability": {"F": float, ...}, "by_category": {label: float},
              "retrieved_chars": float, "failed": {conversation: why}}   (the last three when known;
              a failed conversation's questions count 0)

plus ``candidates_rejected``, ``final_id``, ``boundary`` (:func:`boundary`), ``baselines``
(``{name: {"valid": SCORES, "test": SCORES or null}}``), ``frozen``
(:func:`memgym.evolution.search.select.freeze_choice`), ``integrated``, ``stopped`` (reason or null),
``ledger``, ``scorer``, ``judge_protocol`` (with ``judge_note``, the protocol's source or a custom
file's sha256, under scorer llm), ``sandbox`` (mode label), ``run_card``
(:func:`memgym.llm.runcard.build_card`) and the cost keys
(:func:`memgym.evolution.search.ledger.cost_summary`): ``tokens_by_round`` (``{"rounds": {round:
{role: tokens, "total"}}, "run": {...}}``), ``test_tokens_per_question`` (``{role: float}``, {}
without a test run), ``budgets`` and ``estimated_calls`` (``{role: calls whose token counts are tokenizer estimates}``, {} when none).
``candidates_evaluated`` excludes the seed; ``proposals_failed`` counts proposals not evaluated.
The summary is written from the run's :class:`~memgym.evolution.search.result.EvolveResult`
(:func:`build_summary`); report.md's rows are rendered from the run's round records and archive
(:func:`round_rows`), only when the report is written.
"""
from __future__ import annotations

import json

from memgym.evolution.execution.confine import current_label
from memgym.evolution.search.archive import CAPABILITIES
from memgym.evolution.search.ledger import cost_section, cost_summary
from memgym.evolution.search.rundir import atomic_write_json, atomic_write_text
from memgym.llm.runcard import card_markdown
from memgym.memory_bank.schema import CAPABILITY_NAMES
from memgym.rewards.scoring.judge_protocols import protocol_note
from memgym.rewards.scoring.report import pyplot, save_figure


def split_scores_form(split) -> dict | None:
    """The SCORES form of a stored split (per-task scores left out)."""
    if split is None:
        return None
    out = {"overall": split["overall"], "by_capability": dict(split["by_capability"])}
    for k in ("by_category", "retrieved_chars", "failed"):
        if split.get(k):
            out[k] = split[k]
    return out


def test_of(fin: dict, cid: str) -> dict | None:
    """The test scores (with per-task scores) of archived program ``cid`` in ``final.json``
    (seed, final, or a specialist run on test), None when it was not run on test."""
    if cid == "seed":
        return fin.get("seed_test")
    if cid == fin.get("final"):
        return fin.get("final_test")
    return (fin.get("specialists_test") or {}).get(cid)


def build_summary(state, result, fin: dict, rt=None) -> dict:
    """The summary dict of ``result``, the :class:`~memgym.evolution.search.result.EvolveResult` of
    run ``state`` with ``final.json`` ``fin``; ``run_card`` (:func:`memgym.llm.runcard.build_card`)
    with ``rt``, the run's runtime (which models it loaded)."""
    from dataclasses import asdict

    from memgym.llm.runcard import build_card
    from memgym.rewards.scoring.judge_protocols import protocol_card

    arch = state.archive
    cands = [c for c in arch.candidates.values() if c.id != "seed"]
    totals = state.ledger.totals()
    fr = result.frozen
    root = state.dir.root
    return {
        "rounds": len([h for h in state.history if h.round > 0]),
        "candidates_evaluated": sum(c.status == "evaluated" for c in cands),
        "proposals_failed": sum(c.status in ("failed", "rejected") for c in cands),
        "candidates_rejected": sum(c.status == "rejected" for c in cands),
        "wall_s": round(state.elapsed_s, 1),
        "model_calls": {r: u["calls"] for r, u in totals.items()},
        "tokens": {r: {"prompt": u["prompt"], "completion": u["completion"]} for r, u in totals.items() if r != "embed"},
        "seed": {"valid": result.seed.valid, "test": result.seed.test},
        "final": {"valid": result.valid, "test": result.test, "program": str(root / "best.py"), "id": fr.id},
        "specialists": {c: {"valid": p.valid, "id": p.id, "program": str(root / arch.get(p.id).program),
                            "test": p.test} for c, p in result.specialists.items()},
        "baselines": {name: {"valid": b.valid, "test": b.test, **({"error": b.error} if b.error else {})}
                      for name, b in result.baselines.items()},
        "boundary": boundary(arch, fr.id),
        "integrated": fr.id in [r.candidate for r in arch.merges()],
        "frozen": {"frozen": fr.id, "runner_up": fr.runner_up, "why": fr.why, "pool": fr.pool},
        "final_id": fr.id, "dataset": state.cfg.dataset, "stopped": result.stopped, "ledger": state.ledger.rounds,
        "scorer": state.cfg.scorer, "judge_protocol": state.cfg.judge_protocol, "sandbox": current_label(),
        **({"judge_note": protocol_note(state.cfg.dataset, state.cfg.judge_protocol)}
           if state.cfg.scorer == "llm" else {}),
        **cost_summary(state, fin),
        "run_card": build_card(recipe=asdict(state.cfg), models=state.cfg.model_specs(), runtime=rt,
                               judge=protocol_card(state.cfg.dataset, state.cfg.judge_protocol, state.cfg.scorer),
                               cost={"calls": {r: u["calls"] for r, u in totals.items()},
                                     "tokens": {r: {"prompt": u["prompt"], "completion": u["completion"]}
                                                for r, u in totals.items()}},
                               wall_s=round(state.elapsed_s, 1)),
    }


def boundary(arch, final_id: str) -> dict:
    """PrisMem Fig. 3b for one run: per capability, the peak valid score any evaluated program
    reached (``peak``, ``peak_id``: the first to reach it), the frozen program's (``final``) and
    ``gap`` = peak − final (>= 0)."""
    final = arch.get(final_id).valid.by_capability
    out = {}
    for c in CAPABILITIES:
        pts = [(x.valid.by_capability[c], x.id) for x in arch.evaluated() if c in x.valid.by_capability]
        if not pts:
            continue
        peak = max(v for v, _ in pts)
        out[c] = {"peak": peak, "peak_id": next(i for v, i in pts if v == peak), "final": final.get(c, 0.0),
                  "gap": peak - final.get(c, 0.0)}
    return out


def capability_bars(path, caps: list[str], series: list[tuple], title: str, *, figsize: tuple, ylim: float,
                    legend_size: float, yticks: list | None = None) -> None:
    """A grouped bar chart of valid scores per capability: ``series`` holds (label, values) or
    (label, values, whiskers) per group of bars, values in the order of ``caps``."""
    import numpy as np

    fig, ax = pyplot().subplots(figsize=figsize)
    x, width = np.arange(len(caps)), 0.8 / len(series)
    for i, (name, vals, *err) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, label=name,
               **({"yerr": err[0], "capsize": 3} if err else {}))
    ax.set_xticks(x, [f"{c}\n{CAPABILITY_NAMES[c]}" for c in caps])
    ax.set_ylabel("valid score")
    ax.set_ylim(0, ylim)
    if yticks is not None:
        ax.set_yticks(yticks)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=legend_size, loc="upper center", ncol=len(series), frameon=False)
    save_figure(fig, path)


def plot_boundary(summary: dict, path) -> None:
    """boundary.png: per capability the peak, frozen and seed valid scores (PrisMem Fig. 3b)."""
    b = summary["boundary"]
    caps = list(b)
    if caps:
        capability_bars(path, caps, [("peak of any program", [b[c]["peak"] for c in caps]),
                                     (f"frozen program {summary['final_id']}", [b[c]["final"] for c in caps]),
                                     ("seed", [summary["seed"]["valid"]["by_capability"].get(c, 0.0) for c in caps])],
                        "Performance boundary per capability (valid)", figsize=(7, 4), ylim=1.1, legend_size=8)


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


CATEGORY_WORD = {"beam": "ability", "longmemeval": "question type", "locomo": "category"}


def score_table(rows, caps) -> list[str]:
    """Markdown rows ``program | id | overall | <caps> | retrieved chars`` for ``rows``."""
    present = {c for _, _, sc in rows if sc is not None for c in sc.get("by_capability", {})}
    caps = [c for c in CAPABILITIES if c in caps or c in present]
    out = ["| program | id | overall | " + " | ".join(caps) + " | retrieved chars |", "|" + "---|" * (4 + len(caps))]
    for name, cid, sc in rows:
        if sc is None:
            continue
        rc = sc.get("retrieved_chars")
        out.append(f"| {name} | {cid} | {_f(sc['overall'])} | " + " | ".join(_f(sc["by_capability"].get(c)) for c in caps)
                   + f" | {'-' if rc is None else f'{rc:.0f}'} |")
    return out


def category_table(rows, dataset: str) -> list[str]:
    """One row per native label (BEAM ability, LongMemEval question type); "" when not known."""
    rows = [r for r in rows if r[2] is not None and r[2].get("by_category")]
    if dataset == "locomo" or not rows:
        return []
    labels = list(dict.fromkeys(k for r in rows for k in r[2]["by_category"]))
    if dataset == "beam":
        from memgym.data_synth.beam import BEAM_ABILITIES
        labels = [a for a in BEAM_ABILITIES if a in labels] + [a for a in labels if a not in BEAM_ABILITIES]
    out = [f"| {CATEGORY_WORD.get(dataset, 'category')} | " + " | ".join(f"{n} ({cid})" for n, cid, _ in rows) + " |",
           "|" + "---|" * (1 + len(rows))]
    for lab in labels:
        out.append(f"| {lab} | " + " | ".join(_f(r[2]["by_category"].get(lab)) for r in rows) + " |")
    return out


def round_rows(state) -> list[dict]:
    """One report row per round record: its fields, the candidate's ``status``, ``verdict`` and
    ``valid`` SCORES from the archive (``-`` / None without one), the round's ``tokens`` from the
    ledger, and after a parent fallback the proposal prefixed with it."""
    rows = []
    for h in state.history:
        cand = state.archive.candidates.get(h.candidate)
        proposal = h.proposal or ""
        if h.fallback_from:
            proposal = f"[parent fallback: {h.fallback_from} has nothing left to try] " + proposal
        rows.append({**h.to_json(), "proposal": proposal, "status": cand.status if cand else "-",
                     "verdict": cand.verdict if cand else "-",
                     "valid": cand.valid.scores() if cand and cand.valid else None,
                     "tokens": state.ledger.round_tokens(h.round)})
    return rows


def render_report(state, summary: dict) -> str:
    """``report.md``."""
    cfg = state.cfg
    caps = [c for c in CAPABILITIES if c in summary["seed"]["valid"]["by_capability"]]
    out = [f"# memgym evolve: {cfg.dataset}", "",
           f"- train {', '.join(cfg.train)}; valid {', '.join(cfg.valid)}; test {', '.join(cfg.test) or '(none)'}",
           f"- extractor `{cfg.extractor}`, plan `{cfg.plan_mode}`, scorer `{cfg.scorer}`, proposer `{cfg.proposer}`, "
           f"seed {cfg.seed}; rounds cold {cfg.rounds_cold} / refine {cfg.rounds_refine} / integrate "
           f"{cfg.rounds_integrate}",
           f"- judge_protocol `{summary.get('judge_protocol', cfg.judge_protocol)}` (scorer `{cfg.scorer}`; "
           "`official` = the benchmark's own protocol from data/judges; offline proxies are memgym's, not "
           "the benchmark's number" + (f"; {summary['judge_note']}" if summary.get("judge_note") else "")
           + "); sandbox `" + str(summary.get("sandbox", current_label())) + "`",
           "- context budget: " + (f"every retrieved text cut to {cfg.context_tokens} tokens of "
                                   f"`{cfg.context_tokenizer}` before answering/scoring (the same for every program)"
                                   if cfg.context_tokens else "none (the program's 16,000-character limit only)"),
           f"- {summary['rounds']} rounds in {summary['wall_s']:.0f} s; {summary['candidates_evaluated']} candidates "
           f"evaluated, {summary['proposals_failed']} proposals not evaluated ({summary['candidates_rejected']} "
           f"rejected programs)" + (f"; stopped early: {summary['stopped']}" if summary["stopped"] else ""), "",
           "## Rounds", "",
           "| round | stage | target | parent | candidate | proposal | verdict | valid overall | "
           + " | ".join(caps) + " | accepted | tokens |",
           "|" + "---|" * (10 + len(caps))]
    for h in round_rows(state):
        v = h["valid"] or {}
        bc = v.get("by_capability", {})
        prop = h["proposal"].replace("|", "/")[:70]
        acc = str(h["accepted"] or "").replace("|", "/")[:80]
        out.append(f"| {h['round']} | {h['stage']} | {h['target'] or '-'} | {h['parent'] or '-'} | {h['candidate']} | "
                   f"{prop} | {h['verdict']} | {_f(v.get('overall'))} | " + " | ".join(_f(bc.get(c)) for c in caps)
                   + f" | {acc} | {h['tokens']} |")
    frozen = summary["frozen"]
    roles = {p["id"]: ", ".join(p["roles"]) for p in frozen["pool"]}
    out += ["", "## Frozen program", "", f"- frozen: **{frozen['frozen']}** ({roles.get(frozen['frozen'], '-')}); "
            f"{frozen['why']}.",
            "- rule: the best valid overall among the base, every specialist and every accepted merge (ties: the "
            "later one); it alone decides what runs on test as `final`."]
    valid_rows = [("seed", "seed", summary["seed"]["valid"]),
                  (f"final ({roles.get(summary['final_id'], 'base')})", summary["final_id"], summary["final"]["valid"])]
    valid_rows += [(f"specialist {c} {CAPABILITY_NAMES[c]}", s["id"], s["valid"])
                   for c, s in summary["specialists"].items()]
    base_rows = [(f"baseline {n}", "-", b) for n, b in summary.get("baselines", {}).items()]
    valid_rows += [(n, cid, b["valid"]) for n, cid, b in base_rows]
    out += ["", "## Programs (valid split)", ""] + score_table(valid_rows, caps)
    out += [f"- baseline {n} could not run: {b['error']}" for n, b in summary.get("baselines", {}).items()
            if b.get("error")]
    if summary["final"]["test"] is not None:
        rows = [("seed", "seed", summary["seed"]["test"]), ("final", summary["final_id"], summary["final"]["test"])]
        rows += [(f"specialist {c}", s["id"], s.get("test")) for c, s in summary["specialists"].items()]
        rows += [(n, cid, b["test"]) for n, cid, b in base_rows]
        out += ["", "## Test split (frozen program, run once)", ""] + score_table(rows, caps)
        out += [f"- {name} ({cid}) failed on test conversation {conv} (its questions scored 0): {why}"
                for name, cid, s in rows for conv, why in ((s or {}).get("failed") or {}).items()]
    for split, rows in (("valid", valid_rows), ("test", rows if summary["final"]["test"] is not None else [])):
        table = category_table(rows, state.cfg.dataset)
        if table:
            out += ["", f"## Per {CATEGORY_WORD.get(state.cfg.dataset, 'category')} ({split} split)", ""] + table
    bd = summary.get("boundary") or {}
    if bd:
        out += ["", "## Performance boundary (valid; `boundary.png`, PrisMem Fig. 3b)", "",
                "| capability | peak of any program | reached by | frozen program | gap |", "|---|---|---|---|---|"]
        out += [f"| {c} {CAPABILITY_NAMES[c]} | {_f(v['peak'])} | {v['peak_id']} | {_f(v['final'])} "
                f"| {v['gap']:+.3f} |" for c, v in bd.items()]
    section = integration_section(state.archive)
    if section:
        out += ["", section.rstrip("\n")]
    out += ["", "## Cost", "", f"- model calls per role: `{json.dumps(summary['model_calls'])}`",
            f"- tokens per role: `{json.dumps(summary['tokens'])}`", ""] + cost_section(summary) + ["",
            "Files: `best.py` (the frozen program), `capabilities.png`, `summary.json`, `candidates/<id>/` "
            "(program, proposal transcript, validation, scores).", "",
            *card_markdown(summary.get("run_card"), str(state.dir.root / "summary.json"))]
    return "\n".join(out) + "\n"


def console_summary(s: dict, out: str) -> str:
    """What ``memgym evolve`` prints at the end: per split the seed, specialists, frozen program
    and baselines (and per native label on BEAM / LongMemEval)."""
    lines = [f"\n{s['rounds']} rounds, {s['candidates_evaluated']} candidates evaluated, {s['proposals_failed']} "
             f"proposals not evaluated, {s['wall_s']:.0f} s" + (f"; stopped: {s['stopped']}" if s["stopped"] else "")]
    caps = [c for c in CAPABILITIES if c in s["seed"]["valid"]["by_capability"]]
    frozen = s.get("frozen") or {}
    roles = {p["id"]: ", ".join(p["roles"]) for p in frozen.get("pool", [])}
    rows = [("seed", "seed", s["seed"])]
    rows += [(f"specialist {c}", v["id"], v) for c, v in s["specialists"].items()]
    rows.append((f"frozen ({roles.get(s['final_id'], 'base')})", s["final_id"], s["final"]))
    rows += [(f"baseline {n}", "-", b) for n, b in s.get("baselines", {}).items()]
    dataset = s.get("dataset", "locomo")
    for split in ("valid", "test"):
        if split == "test" and s["final"]["test"] is None:
            continue
        split_rows = [(n, cid, r.get(split)) for n, cid, r in rows]
        lines += [f"\n{split} split", *score_table(split_rows, caps)]
        cat = category_table(split_rows, dataset)
        if cat:
            lines += [f"\n{split} split per {CATEGORY_WORD.get(dataset, 'category')}", *cat]
    if frozen.get("why"):
        lines.append(f"\nfrozen: {frozen['why']}")
    lines.append(f"report: {out}/report.md; frozen program: {out}/best.py")
    return "\n".join(lines)


def plot_capabilities(state, path) -> None:
    """capabilities.png: per capability, the valid score of its specialist after each round."""
    arch = state.archive
    rows = [h for h in state.history if h.specialists and h.round > 0]
    seed = arch.get("seed").valid.by_capability
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for c in CAPABILITIES:
        if c not in seed:
            continue
        xs, ys = [0], [seed[c]]
        for h in rows:
            v = arch.get(h.specialists[c]).valid.by_capability.get(c) if c in h.specialists else None
            if v is not None:
                xs.append(h.round)
                ys.append(v)
        ax.step(xs, ys, where="post", marker="o", ms=3, label=f"{c} {CAPABILITY_NAMES[c]}")
    base_x, base_y = [0] + [h.round for h in rows], [arch.get("seed").valid.overall]
    base_y += [arch.get(h.base).valid.overall for h in rows]
    ax.step(base_x, base_y, where="post", color="black", ls="--", lw=1, label="base (overall)")
    if 0 < state.cfg.rounds_cold < state.cfg.total_rounds:
        ax.axvline(state.cfg.rounds_cold + 0.5, color="grey", lw=0.8, ls=":")
        ax.text(state.cfg.rounds_cold + 0.6, 0.02, "refinement", fontsize=8, color="grey")
    ax.set_xlabel("round")
    ax.set_ylabel(f"valid {state.cfg.scorer} of the specialist")
    ax.set_title("Capability specialists by round")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, path)


def write_reports(state, summary: dict) -> None:
    """Write summary.json, report.md, capabilities.png and boundary.png."""
    atomic_write_json(state.dir.root / "summary.json", summary)
    atomic_write_text(state.dir.root / "report.md", render_report(state, summary))
    plot_capabilities(state, state.dir.root / "capabilities.png")
    plot_boundary(summary, state.dir.root / "boundary.png")


def integration_section(archive) -> str:
    """report.md's "Integration" section: one row per attempt of the archive's integration log
    (empty string when none)."""
    def valid(r):
        c = archive.candidates.get(r.candidate)
        return c.valid.scores() if c and c.valid else {}

    rows = archive.integrations
    if not rows:
        return ""
    caps = [c for c in CAPABILITIES if any(c in valid(r).get("by_capability", {}) for r in rows)]
    out = ["## Integration attempts", "",
           "| round | kind | specialists | paired cases (specialist − base on train) | conflicts settled | "
           "candidate | valid overall | " + "".join(f"{c} | " for c in caps) + "accepted |",
           "|" + "---|" * (8 + len(caps))]
    for r in rows:
        v = valid(r)
        bc = v.get("by_capability", {})
        paired = "; ".join(f"{c}: {p['task']} ({p['gap']:+.2f})" for c, p in r.paired.items()) or "-"
        conf = "; ".join(f"{c['key']} → {c['winner']}" for c in r.conflicts) or "-"
        out.append(f"| {r.round} | {r.attempt} | {', '.join(r.merged_from) or '-'} | "
                   f"{paired} | {conf.replace('|', '/')} | {r.candidate or '-'} | {_f(v.get('overall'))} | "
                   + "".join(f"{_f(bc.get(c))} | " for c in caps) + f"{r.accepted.replace('|', '/')} |")
    return "\n".join(out) + "\n"
