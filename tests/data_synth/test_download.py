"""``memgym data download`` against a local server standing in for GitHub raw and the hub
(:mod:`tests.data_synth.fake_hosts`), serving the real files of ``$MEMGYM_DATA``.

The public LongMemEval files are not in ``$MEMGYM_DATA`` (memgym keeps a compact oracle and a 199-record S
subset), so the tests serve stand-ins built from memgym's files (the oracle written with ``indent=4``;
an S file of the subset's records shuffled among the other oracle records) with the manifest's ``remote``
table pointed at their sha256; the derived files are still checked against the real recorded sha256."""
from __future__ import annotations

import copy
import hashlib
import json
import random

import pytest

import memgym.data_synth.download as dl
from memgym.data_synth.download import download, load_manifest, source_url
from memgym.data_synth.errors import DataChecksumError, DataFormatError, NoNetworkError
from memgym.data_synth.fetch import fetch_file
from memgym.data_synth.paths import data_root
from memgym.launch.cli import main
from tests.data_synth.fake_hosts import FakeHosts, closed_port_url

SHARED = data_root()
LOCOMO = "locomo/locomo10.json"
LOCOMO_SHA = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture(autouse=True)
def _online(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the suite sets it; these tests use a local hub
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("MEMGYM_GITHUB_RAW", raising=False)


@pytest.fixture(scope="module")
def public_oracle() -> bytes:
    """A stand-in for the hub's longmemeval_oracle.json: memgym's oracle records written with indent=4."""
    return json.dumps(json.loads((SHARED / "longmemeval/longmemeval_oracle.json").read_bytes()), indent=4).encode()


def _manifest(**remote: bytes) -> dict:
    """The shipped manifest with the ``remote`` sha256/size of the given stand-ins."""
    m = copy.deepcopy(load_manifest())
    for name, body in remote.items():
        m["remote"][name] = {**m["remote"][name], "sha256": sha(body), "size": len(body)}
    return m


def _serve(hosts: FakeHosts, manifest: dict, datasets, **remote: bytes) -> None:
    """Route every file of ``datasets`` the manifest fetches: the real file, or a ``remote`` stand-in."""
    urls = {"github_raw": hosts.url, "hf_endpoint": hosts.url}
    for rel, e in manifest["files"].items():
        if e["dataset"] in datasets and e["from"] != "asset":
            r = e["from"]["remote"]
            hosts.route(source_url(manifest, e["dataset"], r, **urls), remote[r] if "derive" in e["from"] else SHARED / rel)


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_manifest_records_the_shipped_assets_and_the_shared_data():
    m = load_manifest()
    assert len(m["files"]) == 78 and sum(e["from"] == "asset" for e in m["files"].values()) == 12
    assert sum(e["dataset"] == "beam" and e["from"] != "asset" for e in m["files"].values()) == 63
    for rel, e in m["files"].items():
        if e["from"] == "asset":
            assert sha(dl._asset(rel)) == e["sha256"], rel
    assert m["files"][LOCOMO]["sha256"] == LOCOMO_SHA
    assert download(dl.DATASETS, SHARED).nothing_to_fetch


def test_a_verified_folder_needs_no_network(capsys):
    dead = closed_port_url()
    assert main(["data", "download", "all", "--to", str(SHARED), "--github-raw", dead, "--hf-endpoint", dead]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"{SHARED}: 78 files verified, nothing to fetch"


def test_locomo_download_then_loads(tmp_path, monkeypatch, capsys):
    m = load_manifest()
    with FakeHosts() as hosts:
        _serve(hosts, m, {"locomo"})
        monkeypatch.setenv("MEMGYM_GITHUB_RAW", hosts.url)  # the setting, not the flag
        assert main(["data", "download", "locomo", "--to", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert hosts.requests == [(f"/snap-research/locomo/{m['sources']['locomo']['revision']}/data/locomo10.json", None)]
    assert _files(tmp_path) == ["README.md", "expert/conv-26.jsonl", "expert/conv-30.jsonl", "judges/README.md",
                                "judges/locomo_membuilder.json", "locomo/LICENSE.txt", "locomo/locomo10.json"]
    assert sha((tmp_path / LOCOMO).read_bytes()) == LOCOMO_SHA
    assert "locomo: 5 files written, 2.8 MB received" in out and f"export MEMGYM_DATA={tmp_path}" in out
    monkeypatch.setenv("MEMGYM_DATA", str(tmp_path))
    assert main(["data", "stats", "--dataset", "locomo"]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 1986


def test_checksum_mismatch_names_file_and_hashes_and_writes_nothing(tmp_path, capsys):
    body = bytearray((SHARED / LOCOMO).read_bytes())
    body[1000] ^= 1
    m = load_manifest()
    with FakeHosts() as hosts:
        hosts.route(source_url(m, "locomo", "data/locomo10.json", github_raw=hosts.url), bytes(body))
        assert main(["data", "download", "locomo", "--to", str(tmp_path), "--github-raw", hosts.url]) == 1
    err = capsys.readouterr().err
    assert err == (f"memgym data download: checksum mismatch for {tmp_path / LOCOMO}: expected sha256 {LOCOMO_SHA}, "
                   f"got {sha(bytes(body))} (from {hosts.url}/snap-research/locomo/"
                   f"{m['sources']['locomo']['revision']}/data/locomo10.json); nothing was written\n")
    assert not (tmp_path / LOCOMO).exists() and not list(tmp_path.rglob("*.part"))


@pytest.mark.parametrize("keep_sources", [False, True])
def test_a_cut_download_resumes_through_the_hub_redirect(tmp_path, public_oracle, keep_sources):
    m = _manifest(**{"longmemeval_oracle.json": public_oracle})
    m["files"] = {k: v for k, v in m["files"].items() if k != "longmemeval/longmemeval_s_subset.json"}
    with FakeHosts() as hosts:
        _serve(hosts, m, {"longmemeval"}, **{"longmemeval_oracle.json": public_oracle})
        lfs = "/lfs/longmemeval_oracle.json"
        hosts.cut_once[lfs] = 5_000_000
        report = download(["longmemeval"], tmp_path, manifest=m, hf_endpoint=hosts.url, keep_sources=keep_sources)
    resolve = f"/datasets/xiaowu0162/longmemeval-cleaned/resolve/{m['sources']['longmemeval']['revision']}/longmemeval_oracle.json"
    assert hosts.requests == [(resolve, None), (lfs, None), (resolve, "bytes=5000000-"), (lfs, "bytes=5000000-")]
    assert report.written["longmemeval"].bytes == len(public_oracle) == 15_388_478
    oracle = tmp_path / "longmemeval/longmemeval_oracle.json"
    assert sha(oracle.read_bytes()) == m["files"]["longmemeval/longmemeval_oracle.json"]["sha256"]
    kept = tmp_path / dl.SOURCES_DIR / "longmemeval/longmemeval_oracle.json"
    assert (kept.read_bytes() == public_oracle) if keep_sources else not (tmp_path / dl.SOURCES_DIR).exists()


def test_a_part_file_from_an_earlier_run_is_resumed(tmp_path):
    body = (SHARED / LOCOMO).read_bytes()
    dest = tmp_path / "locomo10.json"
    (tmp_path / "locomo10.json.part").write_bytes(body[:1_234_567])
    with FakeHosts({"/f": body}) as hosts:
        assert fetch_file(hosts.url + "/f", dest, LOCOMO_SHA, len(body)) == len(body) - 1_234_567
        assert hosts.requests == [("/f", "bytes=1234567-")]
        (tmp_path / "locomo10.json.part").write_bytes(body[:10])
        dest.unlink()
        hosts.ignore_range = True  # a server that ignores Range: the part is started over
        assert fetch_file(hosts.url + "/f", dest, LOCOMO_SHA, len(body)) == len(body)
    assert dest.read_bytes() == body and not (tmp_path / "locomo10.json.part").exists()


def test_a_local_write_error_is_not_taken_for_the_network(tmp_path):
    (tmp_path / "f.json.part").mkdir()  # something in the way of the partial file
    with FakeHosts({"/f": b"{}"}) as hosts, pytest.raises(IsADirectoryError):
        fetch_file(hosts.url + "/f", tmp_path / "f.json", sha(b"{}"), 2)
    assert len(hosts.requests) == 1  # not retried as a cut transfer


def test_no_network_one_line_of_what_to_fetch_exit_2(tmp_path, capsys):
    dead = closed_port_url()
    assert main(["data", "download", "all", "--to", str(tmp_path), "--github-raw", dead, "--hf-endpoint", dead]) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    m = load_manifest()
    rev = {k: v["revision"] for k, v in m["sources"].items()}
    assert err.startswith(f"memgym data download: no network: cannot reach {dead}/snap-research/locomo/{rev['locomo']}/"
                          f"data/locomo10.json: [Errno 111] Connection refused; fetch by hand and run again: ")
    hub = f"{dead}/datasets/xiaowu0162/longmemeval-cleaned/resolve/{rev['longmemeval']}"
    assert err.rstrip("\n").split("; fetch by hand and run again: ")[1].split("; ") == [
        f"{dead}/snap-research/locomo/{rev['locomo']}/data/locomo10.json -> {tmp_path / LOCOMO}",
        f"{hub}/longmemeval_oracle.json -> {tmp_path}/.sources/longmemeval/longmemeval_oracle.json",
        f"{hub}/longmemeval_s_cleaned.json -> {tmp_path}/.sources/longmemeval/longmemeval_s_cleaned.json",
        f"63 files under {dead}/mohammadtavakoli78/BEAM/{rev['beam']}/chats/ -> {tmp_path}/beam/ (same sub-paths)"]
    assert _files(tmp_path) == ["README.md", "judges/README.md"]  # the package's own files, nothing fetched


def test_hf_hub_offline_is_honoured_before_any_request(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with FakeHosts() as hosts, pytest.raises(NoNetworkError, match="HF_HUB_OFFLINE is set; fetch by hand"):
        download(["longmemeval"], tmp_path, hf_endpoint=hosts.url)
    assert hosts.requests == []


def _oracle_only(body: bytes) -> dict:
    m = _manifest(**{"longmemeval_oracle.json": body})
    m["files"] = {k: v for k, v in m["files"].items() if k == "longmemeval/longmemeval_oracle.json"}
    return m


def test_the_oracle_does_not_depend_on_the_public_files_orders(tmp_path, public_oracle):
    records = json.loads(public_oracle)
    random.Random(0).shuffle(records)
    records = [dict(reversed(r.items())) for r in records]  # records and keys in other orders
    records[0]["haystack_sessions"] = [[dict(reversed(t.items())) for t in s] for s in records[0]["haystack_sessions"]]
    body = json.dumps(records, indent=2).encode()
    with FakeHosts() as hosts:
        _serve(hosts, _oracle_only(body), {"longmemeval"}, **{"longmemeval_oracle.json": body})
        download(["longmemeval"], tmp_path, manifest=_oracle_only(body), hf_endpoint=hosts.url)
    assert (tmp_path / "longmemeval/longmemeval_oracle.json").read_bytes() == \
        (SHARED / "longmemeval/longmemeval_oracle.json").read_bytes()


def test_a_derived_file_that_does_not_match_is_not_written(tmp_path, public_oracle):
    records = json.loads(public_oracle)
    records[7]["answer"] += "."  # other content: not memgym's file
    body = json.dumps(records, indent=4).encode()
    with FakeHosts() as hosts:
        _serve(hosts, _oracle_only(body), {"longmemeval"}, **{"longmemeval_oracle.json": body})
        with pytest.raises(DataChecksumError, match="checksum mismatch for .*longmemeval_oracle.json: expected sha256 "
                           "939b4ad26703d9f51d718c7a978ac65bbc4c32cdc578155111eb37ecd4f25702, got "):
            download(["longmemeval"], tmp_path, manifest=_oracle_only(body), hf_endpoint=hosts.url)
    assert not (tmp_path / "longmemeval/longmemeval_oracle.json").exists()
    assert not list(tmp_path.rglob("*.part"))


def test_an_s_file_without_the_split_ids_is_named_and_nothing_written(tmp_path):
    body = json.dumps([{"question_id": "x"}]).encode()
    m = _manifest(**{"longmemeval_s_cleaned.json": body})
    m["files"] = {k: v for k, v in m["files"].items() if k == "longmemeval/longmemeval_s_subset.json"}
    with FakeHosts() as hosts:
        _serve(hosts, m, {"longmemeval"}, **{"longmemeval_s_cleaned.json": body})
        with pytest.raises(DataFormatError, match=r"longmemeval_s_cleaned.json, record 945e3d21, field question_id: "
                                                  r"not in the file \(199 of the 199 ids of s_splits.json are missing\)"):
            download(["longmemeval"], tmp_path, manifest=m, hf_endpoint=hosts.url)
    assert _files(tmp_path) == [".sources/longmemeval/longmemeval_s_cleaned.json"]  # kept: a rerun derives from it


@pytest.mark.slow
def test_all_end_to_end_then_data_check_passes(tmp_path, monkeypatch, capsys, public_oracle):
    subset = json.loads((SHARED / "longmemeval/longmemeval_s_subset.json").read_bytes())
    ids = {r["question_id"] for r in subset}
    records = subset + [r for r in json.loads(public_oracle) if r["question_id"] not in ids]
    random.Random(0).shuffle(records)
    public_s = json.dumps(records, indent=4).encode()
    stand_ins = {"longmemeval_oracle.json": public_oracle, "longmemeval_s_cleaned.json": public_s}
    m = _manifest(**stand_ins)
    monkeypatch.setattr(dl, "load_manifest", lambda path=None: m)
    with FakeHosts() as hosts:
        _serve(hosts, m, set(dl.DATASETS), **stand_ins)
        hosts.cut_once["/lfs/longmemeval_s_cleaned.json"] = 40_000_000
        argv = ["data", "download", "all", "--to", str(tmp_path), "--github-raw", hosts.url, "--hf-endpoint", hosts.url]
        assert main(argv) == 0
        n_requests = len(hosts.requests)
        assert n_requests == 1 + 2 * 2 + 2 + 63  # locomo, oracle, S twice (cut, resumed) via 302, 63 BEAM files
        out = capsys.readouterr().out
        assert main(argv) == 0 and len(hosts.requests) == n_requests  # second run: verified, no request
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 78 files verified, nothing to fetch")
    assert len(_files(tmp_path)) == 78 and _files(tmp_path) == sorted(load_manifest()["files"])
    received = sum(len((SHARED / r).read_bytes()) for r, e in m["files"].items()
                   if e["from"] != "asset" and "derive" not in e["from"]) + len(public_oracle) + len(public_s)
    assert f"({received / 1e6:.1f} MB received in " in out
    monkeypatch.setenv("MEMGYM_DATA", str(tmp_path))
    assert main(["data", "check"]) == 0


def test_every_asset_is_package_data():
    import fnmatch
    import tomllib

    from memgym.data_synth.paths import REPO_ROOT

    globs = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["data_synth"]
    assets = [rel for rel, e in load_manifest()["files"].items() if e["from"] == "asset"]
    assert [a for a in assets if not any(fnmatch.fnmatch(f"assets/{a}", g) and
                                         f"assets/{a}".count("/") == g.count("/") for g in globs)] == []
