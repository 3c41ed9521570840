"""``memgym reproduce REPORT [--check] [--strict] [--out DIR] [--no-cache] [--tolerance T]``: rerun
a report's recorded command and compare.

REPORT is a ``report.json`` (``memgym eval``, ``program eval``), ``summary.json`` (``evolve``),
``scores.json`` (``score``), a training run's ``run_card.json`` or ``trainer_state.json``, or a
folder holding one. Its run card (:mod:`memgym.llm.runcard`) is compared with the present environment
first: memgym's commit and changes, package versions, every input file's sha256 (data files
under ``$MEMGYM_DATA`` and files of the checkout are looked up where they are now), each model's
fingerprint, the judge protocol file; what differs is printed before anything runs. Then the
recorded command line is run again in this process (from the recorded working folder, when it
exists) into a new output folder (``--out``, default ``<report folder>-reproduce``; ``evolve
--resume`` runs are started afresh from the recorded recipe) and its headline scores are compared
with the recorded ones (equal within ``--tolerance``, default 0: exactly equal).

Exit status: 0 when every headline score is equal (``--check``: nothing is run; 0 unless
``--strict`` and something differs), 1 when a score differs, when ``--strict`` finds a differing
input or environment (nothing is run), or the status of a rerun that failed; 2 for a REPORT
without a run card or a command that is not memgym's.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from memgym.llm.errors import ConfigError

#: Report files that carry a run card, in the order a folder is searched.
REPORT_FILES = ("report.json", "summary.json", "scores.json", "run_card.json")
#: Flags that turn off the response and stage caches, per command.
NO_CACHE = {"eval": ["--cache", "none", "--stage_cache", "none"], "program": ["--cache", "none", "--stage_cache", "none"],
            "evolve": ["--cache", "none", "--stage_cache", "none"], "score": ["--cache", "none"]}


def load_card(path: str | Path) -> tuple[dict, Path]:
    """``(run card, report file)`` of REPORT (a file or a folder holding one of
    :data:`REPORT_FILES`; ``trainer_state.json`` stands for the ``run_card.json`` beside it).
    ConfigError when there is none."""
    p = Path(path)
    if p.is_dir():
        found = next((p / n for n in REPORT_FILES if (p / n).is_file()), None)
        if found is None:
            raise ConfigError(f"{p}: no {', '.join(REPORT_FILES)} in this folder")
        p = found
    if p.name == "trainer_state.json":
        p = p.parent / "run_card.json"
    if not p.is_file():
        raise ConfigError(f"{p} not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not a JSON report ({e})") from None
    card = data if p.name == "run_card.json" else (data.get("run_card") if isinstance(data, dict) else None)
    if not isinstance(card, dict) or "command" not in card:
        raise ConfigError(f"{p} holds no run card (`run_card`): it was written by a memgym that did not record one")
    return card, p


def _short(h) -> str:
    return "missing" if h is None else str(h)[:12]


def _current_path(entry: dict) -> Path:
    """Where a recorded input is now: under today's data root or checkout when it was under one."""
    from memgym.data_synth.paths import data_root
    from memgym.llm.runcard import DATA, SOURCE, SOURCE_ROOT

    roots = {DATA: data_root(), SOURCE: SOURCE_ROOT}
    return roots[entry["base"]] / entry["rel"] if entry.get("base") in roots else Path(entry["path"])


def _fingerprint(m: dict) -> dict:
    """The parts of a model entry that identify the weights (hashes, trajectory files, server ids)."""
    out = {k: m[k] for k in ("weights_sha256", "tokenizer_sha256", "gguf_sha256") if m.get(k)}
    if isinstance(m.get("base"), dict):
        out["base"] = _fingerprint(m["base"])
    if "servers" in m:
        out["servers"] = [{k: s.get(k) for k in ("id", "root", "parent", "revision", "error") if s.get(k)}
                          for s in m["servers"]]
    return out


def differences(card: dict) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``(differences, notes)``: each difference ``(what, recorded, now)`` among memgym's source,
    package versions, inputs, models and the judge file; notes: the machine and environment
    variables where they differ (they may change results; they are not inputs)."""
    from memgym.llm import runcard

    diffs: list[tuple[str, str, str]] = []
    now = runcard.source()
    for k, v in card["memgym"].items():
        if now.get(k) != v:
            diffs.append((f"memgym {k}", str(v), str(now.get(k))))
    pk = runcard.package_versions()
    diffs += [(f"package {k}", str(v), str(pk.get(k))) for k, v in card["packages"].items() if pk.get(k) != v]
    for e in card["inputs"]:
        h = runcard.file_sha256(_current_path(e))
        if h != e["sha256"]:
            diffs.append((f"input {e.get('rel') or e['path']} ({e['kind']}) at {_current_path(e)}",
                          _short(e["sha256"]), _short(h)))
    judge = card.get("judge") or {}
    if judge.get("file"):
        from memgym.data_synth.paths import data_root

        h = runcard.file_sha256(data_root() / "judges" / Path(judge["file"]).name)
        if h != judge.get("sha256"):
            diffs.append((f"judge protocol file {Path(judge['file']).name}", _short(judge.get("sha256")), _short(h)))
    notes = []
    for role, m in card["models"].items():
        if m.get("used") is False or ("model" in m and m["model"] is None):
            continue  # never loaded, or no model (a replay's files are inputs above)
        cur = runcard.model_entry(m["spec"])
        rec, new = _fingerprint(m), _fingerprint(cur)
        if cur.get("note") == "not prepared" and rec.get("gguf_sha256") == new.get("gguf_sha256"):
            notes.append(f"{role} {m['spec']}: not prepared here; the run prepares it from the same GGUF")
            rec = {k: v for k, v in rec.items() if k == "gguf_sha256"}
        for k in sorted(set(rec) | set(new)):
            if rec.get(k) != new.get(k):
                show = _short if k.endswith("sha256") else str
                diffs.append((f"model {role} {m['spec']} {k}", show(rec.get(k)), show(new.get(k))))
    mc = runcard.machine()
    notes += [f"machine {k}: recorded {v}, now {mc.get(k)}" for k, v in card["machine"].items()
              if k != "gpus" and mc.get(k) != v]
    notes += [f"${k}: recorded {v}, now {os.environ.get(k)}" for k, v in (card.get("env") or {}).items()
              if os.environ.get(k) != v]
    return diffs, notes


def headline(name: str, data: dict) -> dict:
    """The headline numbers of a report, by its file ``name``: eval / program eval overall and per
    capability (each column), evolve's seed / frozen / baseline overall (valid, test), score's
    dataset numbers, a training run's last logged measurements."""
    out: dict = {}

    def scores(prefix: str, r: dict | None, keys=("overall", "overall_recall", "task_averaged", "abstention",
                                                   "judged", "n")):
        if not r:
            return
        out.update({f"{prefix}{k}": r[k] for k in keys if k in r})
        for cap, v in (r.get("by_capability") or {}).items():
            out[f"{prefix}{cap}"] = v["score"] if isinstance(v, dict) else v
        out.update({f"{prefix}{a}": v for a, v in (r.get("by_ability") or {}).items()})

    if name == "summary.json":
        out["frozen program"] = data.get("final_id")
        for who in ("seed", "final"):
            for split in ("valid", "test"):
                scores(f"{who} {split} ", data[who].get(split), keys=("overall",))
        for b, v in (data.get("baselines") or {}).items():
            for split in ("valid", "test"):
                if v.get(split):
                    out[f"baseline {b} {split} overall"] = v[split]["overall"]
    elif name == "trainer_state.json":
        out["global_step"] = data.get("global_step")
        for row in data.get("log_history", []):
            out.update({k: v for k, v in row.items() if k.startswith("memory_eval/") or k in ("loss", "eval_loss")})
    elif "extractor" in data and "answer_model" in data:  # memgym eval: one entry per column
        scores(f"{data.get('column') or data['extractor']}: ", data)
        for label, r in (data.get("compare") or {}).items():
            scores(f"{label}: ", r)
    else:
        scores("", data)
    return out


def _same(a, b, tol: float) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= tol
    return a == b


def _headline_file(report: Path) -> Path:
    return report.parent / "trainer_state.json" if report.name == "run_card.json" else report


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def compare_headlines(recorded: dict, rerun: dict, tol: float) -> list[str]:
    """Lines ``name: recorded = rerun`` / ``!=``; the names that differ are marked ``DIFFERS``."""
    lines = []
    for k in list(dict.fromkeys([*recorded, *rerun])):
        a, b = recorded.get(k, "absent"), rerun.get(k, "absent")
        same = _same(a, b, tol)
        show = _fmt if same else str  # a difference is shown with every digit
        lines.append(f"  {k}: {show(a)} {'=' if same else '!='} {show(b)}" + ("" if same else "   DIFFERS"))
    return lines


def rerun_argv(card: dict, out: Path, no_cache: bool, tmp: Path) -> list[str]:
    """The recorded command (without ``memgym``) writing into ``out``: the command's output flag
    replaced (``--output_dir`` for training); an ``evolve --resume DIR`` becomes a fresh
    ``evolve`` on the recorded recipe (written to ``tmp``)."""
    argv = list(card["command"])
    if not argv or Path(argv[0]).name != "memgym":
        raise ConfigError(f"the recorded command is not a memgym command line ({' '.join(argv)[:200]}); "
                          "memgym reproduce --check compares the inputs only")
    args = argv[1:]
    command = next((a for a in args if not a.startswith("-")), "")  # the only top-level flag is --debug
    if command == "evolve" and "--resume" in args:
        import yaml

        recipe = tmp / "recipe.yaml"
        recipe.write_text(yaml.safe_dump({k: v for k, v in card["recipe"].items() if k != "out"}), encoding="utf-8")
        args = ["evolve", "--config", str(recipe), *(["--no_progress"] if "--no_progress" in args else [])]
    flag = "--output_dir" if command == "train" else "--out"
    kept, skip = [], False
    for a in args:
        if skip or a == flag or a.startswith(flag + "="):
            skip = a == flag
            continue
        kept.append(a)
    if no_cache:
        if command not in NO_CACHE:
            raise ConfigError(f"--no-cache applies to {', '.join(NO_CACHE)}; this run was `{' '.join(argv)[:200]}`")
        kept += NO_CACHE[command]
    return kept + [flag, str(out)]


def _new_out(report: Path) -> Path:
    base = report.resolve().parent
    out, i = base.with_name(base.name + "-reproduce"), 2
    while out.exists():
        out, i = base.with_name(f"{base.name}-reproduce-{i}"), i + 1
    return out


def run(args) -> int:
    """``memgym reproduce`` (module doc). The rerun is its own ``python -m memgym.launch.cli`` process,
    started in the recorded working directory."""
    import subprocess
    import sys

    card, report = load_card(args.report)
    src = card["memgym"]
    print(f"{report}: `{' '.join(card['command'])}`, memgym {src.get('version')} @ {(src.get('commit') or 'no git')[:12]}"
          f"{' with uncommitted changes' if src.get('dirty') else ''}, recorded {card.get('created', '?')}")
    diffs, notes = differences(card)
    print(f"\ninputs and environment: {len(diffs)} differ" if diffs else
          f"\ninputs and environment: the same as recorded (source, {len(card['packages'])} packages, "
          f"{len(card['inputs'])} inputs, {len(card['models'])} models, judge file)")
    for what, rec, now in diffs:
        print(f"  differs: {what}: recorded {rec}, now {now}")
    for n in notes:
        print(f"  note: {n}")
    if args.check:
        return 1 if diffs and args.strict else 0
    if diffs and args.strict:
        print("\n--strict: not rerunning, since inputs or environment differ")
        return 1
    out = Path(args.out).resolve() if args.out else _new_out(report)
    if out == report.resolve().parent:
        raise ConfigError(f"--out {args.out}: that is the recorded run's folder; give a new one")
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        argv = rerun_argv(card, out, args.no_cache, Path(tmp))
        where = Path(card.get("cwd") or here)
        where = where if where.is_dir() else here
        print(f"\nrerunning in {where}: memgym {' '.join(argv)}\n", flush=True)
        rc = subprocess.run([sys.executable, "-m", "memgym.launch.cli", *argv], cwd=where).returncode
    if rc != 0:
        print(f"\nmemgym reproduce: the rerun exited with status {rc}")
        return rc
    rec_file, new_file = _headline_file(report), out / _headline_file(report).name
    recorded = headline(rec_file.name, json.loads(rec_file.read_text(encoding="utf-8")))
    rerun = headline(new_file.name, json.loads(new_file.read_text(encoding="utf-8")))
    lines = compare_headlines(recorded, rerun, args.tolerance)
    n_diff = sum(line.endswith("DIFFERS") for line in lines)
    print(f"\nheadline scores, recorded vs rerun ({new_file}):")
    print("\n".join(lines))
    print(f"\n{len(lines) - n_diff} of {len(lines)} equal" + (f"; {n_diff} differ" if n_diff else ": reproduced")
          + (f" (tolerance {args.tolerance})" if args.tolerance else ""))
    return 1 if n_diff else 0


def register(subparsers) -> None:
    """Add ``memgym reproduce``."""
    p = subparsers.add_parser(
        "reproduce", help="rerun a report's recorded command; compare inputs before and scores after",
        description="Read the run card of REPORT (report.json, summary.json, scores.json, run_card.json, "
                    "trainer_state.json, or a folder holding one), print which inputs and environment parts differ "
                    "from now (memgym commit, packages, data file hashes, model fingerprints, judge protocol file), "
                    "rerun the recorded command into a new folder and compare the headline scores. Exit 1 when a "
                    "score differs.")
    p.add_argument("report", metavar="REPORT", help="the report file or its folder")
    p.add_argument("--check", action="store_true", help="compare inputs and environment only; run nothing")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 without rerunning when an input or the environment differs")
    p.add_argument("--out", default=None, help="the rerun's output folder (default: <report folder>-reproduce)")
    p.add_argument("--no_cache", "--no-cache", dest="no_cache", action="store_true",
                   help="rerun without the response and stage caches (every model call is made again)")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="largest absolute difference counted as equal (default 0: exactly equal)")
    p.set_defaults(func=run)
