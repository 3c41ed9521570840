"""``memgym program ...``: memory-program commands.

- ``memgym program check FILE.py [--parent P.py] [--no-probe] [--stats] [--timeout S]``
  runs the four validation levels (``evolution.validate``) in the sandbox and prints ONE JSON
  line ``{"ok": bool, "level": 1-4 or null, "reason": str}`` (plus ``"stats"`` with
  ``--stats``). Exit status 0 for any verdict, 2 when FILE (or the parent) cannot be read;
  never a traceback, whatever the candidate does.

Further subcommands (e.g. ``program eval``) register on the same ``program`` sub-parser via
:func:`register`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def _emit(payload: dict) -> None:
    print(json.dumps(payload, ensure_ascii=False))


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def cmd_check(args: argparse.Namespace) -> int:
    """Validate one program file; print the verdict as JSON."""
    texts = {}
    for key, path in (("source", args.file), ("parent", args.parent)):
        if path is None:
            texts[key] = None
            continue
        try:
            texts[key] = _read(path)
        except (OSError, UnicodeDecodeError) as e:
            _emit({"ok": False, "level": None, "reason": f"cannot read {path}: {type(e).__name__}: {e}"})
            return 2
    source, parent = texts["source"], texts["parent"]
    try:
        from evolution.validate import ValidationLimits, validate_program

        limits = ValidationLimits(run_probe=not args.no_probe)
        if args.timeout is not None:
            limits = dataclasses.replace(limits, sandbox=dataclasses.replace(
                limits.sandbox, call_timeout_s=args.timeout, load_timeout_s=args.timeout))
        result = validate_program(source, parent, limits, progress=sys.stderr.isatty())
        _emit(result.to_dict(with_stats=args.stats))
    except Exception as e:  # noqa: BLE001 - the contract is "never a traceback"
        _emit({"ok": False, "level": None, "reason": f"internal error: {type(e).__name__}: {e}"})
    return 0


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``program`` command group (with its own sub-subcommands) to ``subparsers``."""
    p = subparsers.add_parser(
        "program", help="memory programs: validate candidates (and, later, evaluate them)",
        description="Commands for PrisMem-style memory programs (one Python module defining MemoryUnit, Query, "
                    "Memory and the three instruction strings).")
    sub = p.add_subparsers(dest="program_command", metavar="SUBCOMMAND")
    sub.required = True
    c = sub.add_parser(
        "check", help="run the 4 validation levels on a program file and print a JSON verdict",
        description="Validate a memory program in the sandbox: (1) source parses, allowed imports only, loads and "
                    "defines the required names, differs from --parent; (2) schemas and signatures; (3) smoke tests "
                    "on a stub backend, retrieve within 16,000 characters; (4) a ~2K-unit complexity probe. Prints "
                    '{"ok": bool, "level": 1-4|null, "reason": str}. Exit 0 for a verdict, 2 if FILE is unreadable.')
    c.add_argument("file", metavar="FILE.py", help="the memory program to check")
    c.add_argument("--parent", metavar="PARENT.py", help="the program FILE was patched from (a no-op patch fails level 1)")
    c.add_argument("--no-probe", action="store_true", help="skip level 4 (the complexity probe)")
    c.add_argument("--stats", action="store_true", help="add timing and toolkit-call statistics to the JSON")
    c.add_argument("--timeout", type=_positive, metavar="S",
                   help="wall seconds allowed for loading and for each call (default 20)")
    c.set_defaults(func=cmd_check)
    return p
