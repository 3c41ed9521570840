"""``memgym bank replay`` and ``memgym bank check``."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _replay(args) -> int:
    from memgym.data_synth.expert import replay
    from memgym.llm.errors import ConfigError

    if args.out and Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} is a directory; give a file path (BANK.json)")
    bank = replay(args.trajectories)  # a bad line or a missing file: raised, exit status 1
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(bank.dumps(), encoding="utf-8")
    print(json.dumps(bank.summary()))
    return 0


def check_output(manager: str, raw: bytes, bank_text: str | None = None, finish_reason: str | None = None) -> dict:
    """The verdict of ``memgym bank check``: never raises for any input bytes. A cut-off
    output (unterminated JSON, or ``finish_reason == "length"``) is error ``truncated``."""
    from memgym.memory_bank.bank import MemoryBank
    from memgym.memory_bank.errors import BankFormatError, ManagerOutputError

    try:
        bank = MemoryBank.loads(bank_text) if bank_text is not None else MemoryBank()
    except BankFormatError as e:
        return {"ok": False, "error": "bank_format_error", "message": str(e)}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"ok": False, "error": "parse_error", "message": f"input is not UTF-8 text (byte {e.start})"}
    try:
        bank.apply_text(manager, text, bank.session + 1, finish_reason=finish_reason)
    except ManagerOutputError as e:
        return {"ok": False, "error": e.error_type, "message": str(e)}
    except RecursionError:
        return {"ok": False, "error": "parse_error", "message": "input nests too deeply"}
    return {"ok": True, "error": None, "message": "valid; applies cleanly"}


def _check(args) -> int:
    bank_text = None
    if args.bank:
        try:
            bank_text = Path(args.bank).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(json.dumps({"ok": False, "error": "bank_file_error", "message": f"cannot read {args.bank}: {e}"}))
            return 0
    try:
        verdict = check_output(args.manager, sys.stdin.buffer.read(), bank_text, args.finish_reason)
    except Exception as e:  # noqa: BLE001 - the contract is "never a traceback"
        verdict = {"ok": False, "error": "internal_error", "message": f"{type(e).__name__}: {e}"}
    print(json.dumps(verdict))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bank", help="replay trajectories into a bank; check a manager output")
    s = p.add_subparsers(dest="bank_command", metavar="ACTION")
    s.required = True
    r = s.add_parser("replay", help="replay an expert trajectory JSONL and print the final bank's counts",
                     description="Replay TRAJ.jsonl session by session. Prints JSON {sessions, core_chars, "
                                 "episodic, semantic, procedural}. Exits 1 naming the line that fails.")
    r.add_argument("trajectories", metavar="TRAJ.jsonl")
    r.add_argument("--out", metavar="BANK.json", help="also write the final bank as JSON")
    r.set_defaults(func=_replay)
    c = s.add_parser("check", help="validate one manager output read from stdin",
                     description="Reads one manager output on stdin and prints "
                                 '{"ok": bool, "error": <type or null>, "message": str}. Always exits 0.')
    c.add_argument("--manager", required=True, choices=["core", "episodic", "semantic", "procedural"])
    c.add_argument("--bank", metavar="BANK.json", help="bank to validate against (default: empty bank)")
    c.add_argument("--finish_reason", choices=["stop", "length"],
                   help="the completion's finish reason, when known: 'length' (cut off by the token limit) is "
                        "reported as error 'truncated' whatever the text")
    c.set_defaults(func=_check)
