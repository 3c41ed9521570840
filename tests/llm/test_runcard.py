"""The run card's parts (:mod:`memgym.llm.runcard`): file hashes, the input registry, git, model
fingerprints (local dirs, served models) and the Markdown section."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memgym.llm import runcard


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_file_is_hashed_once_per_path_mtime_and_size(tmp_path):
    import os

    f = tmp_path / "data.json"
    f.write_bytes(b'{"a": 1}')
    assert runcard.file_sha256(f) == _sha(b'{"a": 1}')
    st = f.stat()
    f.write_bytes(b'{"a": 2}')  # same size; the old mtime put back: the cached hash is returned
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert runcard.file_sha256(f) == _sha(b'{"a": 1}')
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a new mtime: hashed again
    assert runcard.file_sha256(f) == _sha(b'{"a": 2}')
    assert runcard.file_sha256(tmp_path / "missing") is None


def test_inputs_are_recorded_relative_to_their_root_and_forgotten_by_begin(tmp_path):
    data = tmp_path / "data"
    (data / "locomo").mkdir(parents=True)
    f = data / "locomo" / "x.json"
    f.write_text("[]")
    other = tmp_path / "preds.jsonl"
    other.write_text("")
    runcard.begin(["memgym", "score"])
    try:
        runcard.record_input(f, "LoCoMo file", data_root=data)
        runcard.record_input(other, "predictions", data_root=data)
        runcard.record_input(f, "trajectory file", data_root=data, spec="expert:x")
        assert runcard.inputs() == [
            {"path": str(f), "kind": "trajectory file", "base": "MEMGYM_DATA", "rel": "locomo/x.json",
             "specs": ["expert:x"], "sha256": _sha(b"[]"), "bytes": 2},
            {"path": str(other), "kind": "predictions", "sha256": _sha(b""), "bytes": 0}]
        assert runcard.command() == ["memgym", "score"]
        assert runcard.model_entry("expert:x")["files"] == {str(f): _sha(b"[]")}
    finally:
        runcard.begin(None)
    assert runcard.inputs() == []


def test_source_outside_a_git_checkout_or_without_git_is_none(tmp_path, monkeypatch):
    import subprocess

    root, real = runcard.SOURCE_ROOT, runcard.source()
    head = subprocess.run(["git", "-C", str(runcard.SOURCE_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert real["commit"] == head.stdout.strip() and real["version"] == "0.1.0" and isinstance(real["dirty"], bool)
    runcard.begin(["memgym", "eval"])  # the source as the command starts is the code that runs
    try:
        monkeypatch.setattr(runcard, "SOURCE_ROOT", tmp_path)  # a folder no git repository holds
        assert runcard.source() == {"version": "0.1.0", "commit": None, "dirty": None, "diff_sha256": None}
        assert runcard.build_card(recipe={}, models={})["memgym"] == real
    finally:
        runcard.begin(None)
    monkeypatch.setattr(runcard, "SOURCE_ROOT", root)
    monkeypatch.setenv("PATH", str(tmp_path))  # no git program at all
    assert runcard.source()["commit"] is None


def test_a_model_dir_is_fingerprinted_by_its_weights_and_tokenizer_files(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"W1")
    (d / "tokenizer.json").write_text("{}")
    (d / "training_args.bin").write_bytes(b"not weights")  # TRL's pickled arguments: not part of the model
    (d / "config.json").write_text("{}")
    e = runcard.model_entry(f"hf:{d}")
    assert e["weights_sha256"] == _sha(f"model.safetensors\0{_sha(b'W1')}\n".encode())
    assert e["tokenizer_sha256"] == _sha(f"tokenizer.json\0{_sha(b'{}')}\n".encode())
    (d / "model.safetensors").write_bytes(b"W2")  # retrained: another fingerprint
    assert runcard.model_entry(f"hf:{d}")["weights_sha256"] != e["weights_sha256"]
    a = tmp_path / "adapter"
    a.mkdir()
    (a / "adapter_model.safetensors").write_bytes(b"A")
    (a / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(d)}))
    assert runcard.model_entry(f"hf:{a}")["base"]["weights_sha256"] == runcard.dir_entry(d)["weights_sha256"]
    assert runcard.model_entry("hf:/no/such/dir")["error"] == "not a directory"
    assert runcard.model_entry("hf:x", loaded=False) == {"spec": "hf:x", "used": False}
    assert runcard.model_entry("turns")["model"] is None


def _models_server(reply: dict):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/v1"


def test_a_served_model_is_named_by_the_servers_models_reply(stub_backend):
    from memgym.llm.server import serve_backend

    server, url = _models_server({"object": "list", "data": [
        {"id": "Qwen/Qwen3-4B", "object": "model", "root": "/models/qwen3-4b", "revision": "abc123",
         "max_model_len": 32768}]})
    try:
        e = runcard.model_entry(f"openai:{url}#Qwen/Qwen3-4B")
        assert e["servers"] == [{"url": url, "id": "Qwen/Qwen3-4B", "root": "/models/qwen3-4b", "revision": "abc123",
                                 "max_model_len": 32768}]
        assert "not listed (Qwen/Qwen3-4B)" in runcard.model_entry(f"openai:{url}#other")["servers"][0]["error"]
    finally:
        server.shutdown()
        server.server_close()
    builtin, _, burl = serve_backend(stub_backend(["x"]), served_model_name="tiny")
    try:
        assert runcard.model_entry(f"openai:{burl}#tiny")["servers"] == [{"url": burl, "id": "tiny"}]
    finally:
        builtin.shutdown()
        builtin.server_close()
    dead = runcard.model_entry("openai:http://127.0.0.1:9/v1#m")["servers"][0]  # nothing listens: recorded
    assert dead["url"] == "http://127.0.0.1:9/v1" and "Error" in dead["error"]


def test_build_card_marks_models_the_runtime_never_loaded(tmp_path):
    from memgym.llm.embeddings import HashEmbedder
    from memgym.llm.runtime import Runtime
    from tests.helpers import ScriptedBackend

    rt = Runtime(embedder=HashEmbedder(16))
    rt.register("openai:http://127.0.0.1:9/v1#judge", ScriptedBackend(["CORRECT"]))
    card = runcard.build_card(recipe={"seed": 3, "data_seed": None, "seed_program": "p.py", "out": "x"},
                              models={"extractor": "turns", "task_model": "hf:smollm2", "judge_model": None},
                              runtime=rt, wall_s=1.5)
    assert card["models"]["task_model"] == {"spec": "hf:smollm2", "used": False}
    assert card["models"]["embedder"] == {"spec": "hash-16", "model_id": "hash-16", "model": None, "note": "no model"}
    assert "judge_model" not in card["models"] and card["seeds"] == {"seed": 3, "data_seed": None}
    assert card["cost"] == {"calls": {"embed": 0}, "tokens": {}} and card["wall_s"] == 1.5
    assert set(card["packages"]) == {"python", *runcard.PACKAGES}
    md = "\n".join(runcard.card_markdown(card, "runs/x/report.json"))
    assert "## Run card" in md and "task_model `hf:smollm2` (not loaded)" in md
    assert "memgym reproduce runs/x/report.json" in md
