"""``memgym data download``: LoCoMo, LongMemEval and BEAM from their public sources at pinned revisions,
and memgym's own small files (package data), into the layout memgym reads (``$MEMGYM_DATA``,
:mod:`memgym.data_synth.paths`). Every file is checked against the sha256 recorded in
``data_synth/data_manifest.json``; a folder that already holds them all is used as is, without network.

The manifest holds:

- ``sources``: per dataset, its host (``github``: the raw files of a repository at a commit, from
  ``<github_raw>/<repo>/<commit>/<path>``; ``hub``: a Hugging Face dataset repository at a revision,
  through :func:`huggingface_hub.hf_hub_url`), the repository, the revision and the licence;
- ``remote``: public files fetched only to derive others (into ``<to>/.sources/<dataset>/``, removed
  once derived unless ``keep_sources``), each with its sha256 and size;
- ``files``: every file of the layout with its sha256, size and origin: ``"asset"`` (copied from
  ``data_synth/assets/``: the expert trajectories, judge protocols, LongMemEval splits, licences and
  READMEs), ``{"remote": path}`` (the source's file unchanged) or ``{"remote": path, "derive": rule}``
  (made from a ``remote`` file by a rule of :data:`DERIVE`).

Pins. BEAM: mohammadtavakoli78/BEAM at b2a3ee8ba12d68f83143dda191097dc3e028ddd3; every recorded sha256
belongs to bytes whose git blob id is the one in that commit's tree. LoCoMo: snap-research/locomo at
3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376, ``data/locomo10.json``; the recorded sha256 is the one other
harnesses publish for that URL. LongMemEval: xiaowu0162/longmemeval-cleaned at
98d7416c24c778c2fee6e6f3006e7a073259d48f; the sha256 and sizes of ``longmemeval_oracle.json`` and
``longmemeval_s_cleaned.json`` are the ones other harnesses publish for that revision, and the two rules
of :data:`DERIVE` are inferred from the files memgym reads (see each rule); the derived files' own
sha256 is what checks them.

Cost: ``all`` transfers about 348 MB (LongMemEval-S alone 277 MB, from which the 103 MB subset is
derived; parsing it takes about 2 GB of memory for a few seconds); verifying a complete folder hashes
its 172 MB (about a second)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable

from memgym.data_synth.errors import DataChecksumError, DataFormatError, NoNetworkError
from memgym.data_synth.fetch import fetch_file, sha256_of

DATASETS = ("locomo", "longmemeval", "beam")
GITHUB_RAW = "https://raw.githubusercontent.com"
HF_ENDPOINT = "https://huggingface.co"
GITHUB_RAW_ENV = "MEMGYM_GITHUB_RAW"
SOURCES_DIR = ".sources"


#: memgym's key order of a LongMemEval record and of a turn (the order of its oracle file).
LME_KEYS = ("question_id", "question_type", "question", "answer", "question_date", "haystack_dates",
            "haystack_session_ids", "haystack_sessions", "answer_session_ids")
TURN_KEYS = ("role", "content", "has_answer")


def _ordered(d: dict, keys: tuple[str, ...]) -> dict:
    rank = {k: i for i, k in enumerate(keys)}
    return dict(sorted(d.items(), key=lambda kv: rank.get(kv[0], len(keys))))


def _record(r: dict) -> dict:
    """``r`` with its keys and its turns' keys in memgym's order."""
    sessions = r.get("haystack_sessions")
    if isinstance(sessions, list):
        r = {**r, "haystack_sessions": [[_ordered(t, TURN_KEYS) if isinstance(t, dict) else t for t in sess]
                                        if isinstance(sess, list) else sess for sess in sessions]}
    return _ordered(r, LME_KEYS)


def _oracle(raw: bytes, source: Path) -> bytes:
    """memgym's oracle file from the public one: the records in the order of
        ``data_synth/longmemeval_oracle_order.json``, keys in :data:`LME_KEYS` / :data:`TURN_KEYS` order,
        values unchanged, written with :func:`json.dumps` defaults (ASCII escapes). The public file is
        the same JSON written with ``indent=4`` (memgym's file written so has exactly its 15,388,478
        bytes); the orders are fixed here so that the result does not depend on the public file's.
        DataFormatError naming ``source`` when a record of that order is not in it."""
    order = json.loads(resources.files("data_synth").joinpath("longmemeval_oracle_order.json").read_text("utf-8"))
    by_id = {r["question_id"]: r for r in json.loads(raw)}
    missing = [q for q in order if q not in by_id]
    if missing:
        raise DataFormatError(source, missing[0], "question_id", f"not in the file ({len(missing)} of the "
                                                                 f"{len(order)} oracle ids are missing)")
    return json.dumps([_record(by_id[q]) for q in order]).encode("utf-8")


def _s_subset(raw: bytes, source: Path) -> bytes:
    """The records of ``longmemeval/s_splits.json`` (package data), in its order ``train``, ``valid``,
        ``test``, each unchanged, written with ``json.dumps(..., ensure_ascii=False)``. DataFormatError
        naming ``source`` when one of those ids is not in it."""
    splits = json.loads(_asset("longmemeval/s_splits.json"))
    by_id = {r["question_id"]: r for r in json.loads(raw)}
    ids = [q for name in ("train", "valid", "test") for q in splits[name]]
    missing = [q for q in ids if q not in by_id]
    if missing:
        raise DataFormatError(source, missing[0], "question_id", f"not in the file ({len(missing)} of the "
                                                                 f"{len(ids)} ids of s_splits.json are missing)")
    return json.dumps([by_id[q] for q in ids], ensure_ascii=False).encode("utf-8")


#: derive rule name -> function(bytes of the remote file, its path) -> bytes of the layout's file.
DERIVE: dict[str, Callable[[bytes, Path], bytes]] = {"oracle": _oracle, "s_subset": _s_subset}


def load_manifest(path: Path | str | None = None) -> dict:
    """The parsed manifest (default: the package's ``data_manifest.json``)."""
    if path is None:
        return json.loads(resources.files("data_synth").joinpath("data_manifest.json").read_text("utf-8"))
    return json.loads(Path(path).read_text("utf-8"))


def _asset(rel: str) -> bytes:
    return resources.files("data_synth").joinpath("assets", *rel.split("/")).read_bytes()


def _verified(path: Path, entry: dict) -> bool:
    return path.is_file() and path.stat().st_size == entry["size"] and sha256_of(path) == entry["sha256"]


def _write_checked(dest: Path, data: bytes, sha256: str, source: str) -> None:
    """``data`` into ``dest`` through ``<dest>.part`` and a rename, only when its sha256 is ``sha256``."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise DataChecksumError(dest, sha256, actual, source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    part.write_bytes(data)
    os.replace(part, dest)


def source_url(manifest: dict, dataset: str, path: str, *, github_raw: str | None = None,
               hf_endpoint: str | None = None) -> str:
    """The URL of ``path`` in ``dataset``'s pinned source. ``github_raw`` defaults to
        ``$MEMGYM_GITHUB_RAW``, else raw.githubusercontent.com; ``hf_endpoint`` to ``$HF_ENDPOINT``, else
        huggingface.co."""
    src = manifest["sources"][dataset]
    if src["host"] == "github":
        base = github_raw or os.environ.get(GITHUB_RAW_ENV) or GITHUB_RAW
        return f"{base.rstrip('/')}/{src['repo']}/{src['revision']}/{path}"
    from huggingface_hub import hf_hub_url

    endpoint = (hf_endpoint or os.environ.get("HF_ENDPOINT") or HF_ENDPOINT).rstrip("/")
    return hf_hub_url(src["repo"], path, repo_type="dataset", revision=src["revision"], endpoint=endpoint)


@dataclass
class DatasetResult:
    """What one dataset took: files written (``files``), bytes received over the network (``bytes``),
        wall seconds."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class DownloadReport:
    """``checked``: the files of the selection; ``written``: per dataset (``shared``: the READMEs every
        selection gets), only those that had something to write."""

    to: Path
    checked: int
    written: dict[str, DatasetResult] = field(default_factory=dict)

    @property
    def nothing_to_fetch(self) -> bool:
        return not self.written


def _todo_line(manifest: dict, todo: list[tuple[str, dict]], to: Path, **urls) -> str:
    """What is left to fetch by hand, per dataset: ``URL -> file``, or ``N files under URL/ -> folder/``
        when the sub-paths are the same on both sides."""
    groups: dict[tuple[str, bool], list[tuple[str, str]]] = {}
    for rel, entry in todo:
        if entry["from"] != "asset":
            derived = "derive" in entry["from"]
            local = f"{SOURCES_DIR}/{entry['dataset']}/{entry['from']['remote']}" if derived else rel
            groups.setdefault((entry["dataset"], derived), []).append((entry["from"]["remote"], local))
    out = []
    for (dataset, _), pairs in groups.items():
        pairs = sorted(set(pairs))
        if len(pairs) == 1:
            out.append(f"{source_url(manifest, dataset, pairs[0][0], **urls)} -> {to / pairs[0][1]}")
            continue
        remote = os.path.commonpath([r for r, _ in pairs])
        local = os.path.commonpath([loc for _, loc in pairs])
        if all(r[len(remote):] == loc[len(local):] for r, loc in pairs):
            out.append(f"{len(pairs)} files under {source_url(manifest, dataset, remote, **urls)}/ -> {to / local}/ "
                       f"(same sub-paths)")
        else:
            out += [f"{source_url(manifest, dataset, r, **urls)} -> {to / loc}" for r, loc in pairs]
    return "; ".join(out)


def _prune(folder: Path) -> None:
    """Remove ``folder`` and its sub-folders where they hold no file."""
    if folder.is_dir():
        for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
        if not any(folder.iterdir()):
            folder.rmdir()


def download(datasets: Iterable[str], to: Path | str, *, manifest: dict | None = None, github_raw: str | None = None,
             hf_endpoint: str | None = None, keep_sources: bool = False,
             log: Callable[[str], None] = lambda s: None) -> DownloadReport:
    """Make ``to`` hold every file of ``datasets`` (names of :data:`DATASETS`) with its recorded sha256:
        files already there and verified are kept, package assets are copied, the rest is fetched from the
        pinned sources (or derived from fetched files). Raises NoNetworkError (nothing fetched yet: its
        message lists every URL left and where each goes), DownloadError, DataChecksumError."""
    manifest = manifest or load_manifest()
    to = Path(to).expanduser().resolve()
    wanted = set(datasets) | {"shared"}
    selection = [(rel, e) for rel, e in manifest["files"].items() if e["dataset"] in wanted]
    todo = [(rel, e) for rel, e in selection if not _verified(to / rel, e)]
    report = DownloadReport(to, len(selection))
    if not todo:
        return report
    urls = {"github_raw": github_raw, "hf_endpoint": hf_endpoint}
    needs_hub = any(e["from"] != "asset" and manifest["sources"][e["dataset"]]["host"] == "hub" for _, e in todo)
    if needs_hub and os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        raise NoNetworkError(hf_endpoint or os.environ.get("HF_ENDPOINT") or HF_ENDPOINT,
                             "HF_HUB_OFFLINE is set; fetch by hand and run again: "
                             + _todo_line(manifest, todo, to, **urls))
    ordered = [(rel, e) for dataset in ("shared", *DATASETS) for rel, e in todo if e["dataset"] == dataset]
    used_sources: set[Path] = set()
    for i, (rel, entry) in enumerate(ordered):
        dataset, dest, origin = entry["dataset"], to / rel, entry["from"]
        res = report.written.setdefault(dataset, DatasetResult())
        t0 = time.perf_counter()
        try:
            if origin == "asset":
                _write_checked(dest, _asset(rel), entry["sha256"], f"package data data_synth/assets/{rel}")
            elif "derive" in origin:
                remote = manifest["remote"][origin["remote"]]
                src = to / SOURCES_DIR / dataset / origin["remote"]
                url = source_url(manifest, dataset, origin["remote"], **urls)
                res.bytes += fetch_file(url, src, remote["sha256"], remote["size"])
                used_sources.add(src)
                _write_checked(dest, DERIVE[origin["derive"]](src.read_bytes(), src), entry["sha256"],
                               f"{origin['derive']} of {url}")
            else:
                url = source_url(manifest, dataset, origin["remote"], **urls)
                res.bytes += fetch_file(url, dest, entry["sha256"], entry["size"])
        except NoNetworkError as e:
            raise NoNetworkError(e.url, f"{e.reason}; fetch by hand and run again: "
                                 + _todo_line(manifest, ordered[i:], to, **urls)) from None
        res.files += 1
        res.seconds += time.perf_counter() - t0
        if i + 1 == len(ordered) or ordered[i + 1][1]["dataset"] != dataset:
            log(f"{dataset}: {res.files} files written, {res.bytes / 1e6:.1f} MB received, {res.seconds:.1f} s")
    if not keep_sources:
        for src in used_sources:
            src.unlink(missing_ok=True)
        _prune(to / SOURCES_DIR)
    return report
