"""Issue 19, section 2, findings 9-12: structured outputs a server ignores, core REPLACE narrowed
to the block's lines, an expert file of another conversation, BEAM selections, bench arguments."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from data_synth.paths import data_root
from launch.cli import main as memgym
from llm.base import GenerationParams
from llm.errors import ConfigError
from tests.helpers import ScriptedBackend


class SchemaIgnoringBackend(ScriptedBackend):
    """A model behind a server without structured outputs: the schema is accepted and ignored."""

    def generate(self, batch, params, schemas=None):
        return super().generate(batch, params)


# ------------------------------------------------------------------ finding 9


def _ask(url: str, schema):
    from llm.openai_backend import OpenAIBackend

    client = OpenAIBackend(url, "m", max_retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = client.generate([[{"role": "user", "content": "core?"}]], GenerationParams(max_new_tokens=32),
                              schemas=[schema])
    return client, out[0].text, [str(w.message) for w in caught]


def test_f9_a_server_that_ignores_response_format_is_named():
    from llm.server import serve_backend
    from memory_bank.action_schemas import manager_schema

    schema = manager_schema("core")
    for reply, ignored in (("Sure! Here is the update you asked for.", 1), ('{"operation": "NONE"}', 0)):
        server, _, url = serve_backend(SchemaIgnoringBackend([reply], model_id="m"), served_model_name="m")
        try:
            client, text, caught = _ask(url, schema)
        finally:
            server.shutdown()
            server.server_close()
        assert text == reply and client.schema_ignored == ignored
        named = [m for m in caught if "outside the JSON schema" in m]
        if ignored:
            assert named == [f"OpenAIBackend: the server {url} (model 'm') returned output outside the JSON schema "
                             "'memgym_core' it was sent as response_format (not JSON: 'Sure! Here is the update you "
                             "asked for.'): it ignores structured outputs, so the parse/schema failures that follow "
                             "are the server's, not the model's. Use a server that honours response_format (vLLM, "
                             "SGLang) or set `constrained: false`."]
        else:
            assert named == []


def test_f9_schema_mismatch_reads_the_manager_schemas():
    from llm.openai_backend import schema_mismatch
    from memory_bank.action_schemas import manager_schema

    core = manager_schema("core", None, ("Jon: dancer.", "Gina: lost her job.")).schema
    assert schema_mismatch('{"operation": "REPLACE", "old_text": "Jon: dancer.", "new_text": "Jon: studio owner."}',
                           core) == ""
    assert schema_mismatch('{"operation": "REPLACE", "old_text": "Jon", "new_text": "x"}', core) == \
        "$ matches none of its 4 alternatives"
    part = manager_schema("episodic", ("E1",)).schema
    assert schema_mismatch('{"operations": [{"action": "DELETE", "id": "E1"}]}', part) == ""
    assert schema_mismatch('{"operations": [{"action": "DELETE", "id": "E2"}]}', part) == \
        "$.operations[0] matches none of its 3 alternatives"
    assert schema_mismatch('{"operations": []}', part) == ""
    assert schema_mismatch('{"ops": []}', part) == "$ lacks 'operations'"


def test_f9_core_replace_is_narrowed_to_the_lines_of_the_block():
    from llm.grammar import SchemaCompiler
    from llm.models import prepare_smollm2_tokenizer
    from memory_bank.action_schemas import prompt_schema
    from memory_bank.bank import MemoryBank
    from memory_bank.prompts import build_prompt
    from memory_bank.schema import Session, Turn
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    compiler = SchemaCompiler(tok, [tok.eos_token_id])
    session = Session(index=2, id="s2", date=None, date_text="8 May 2023", turns=(Turn("D2:1", "Jon", "Hi"),))
    bank = MemoryBank()
    bank.core = "Jon: banker.\n\nGina: lost her job at Door Dash."
    prompt = build_prompt("core", bank, session)
    assert prompt.core_lines == ("Jon: banker.", "Gina: lost her job at Door Dash.")
    schema = prompt_schema(prompt)
    old = schema.schema["$defs"]["CoreReplace"]["properties"]["old_text"]
    assert old == {"enum": ["Jon: banker.", "Gina: lost her job at Door Dash."], "title": "Old Text", "type": "string"}
    ok = '{"operation": "REPLACE", "old_text": "Jon: banker.", "new_text": "Jon: dance studio owner."}'
    absent = '{"operation": "REPLACE", "old_text": "Jon: banker at a bank.", "new_text": "x"}'
    assert compiler.accepts(schema, ok) and not compiler.accepts(schema, absent)
    assert compiler.accepts(schema, '{"operation": "APPEND", "content": "Gina: opened a store."}')
    empty = prompt_schema(build_prompt("core", MemoryBank(), session))
    assert [b["$ref"] for b in empty.schema["anyOf"]] == ["#/$defs/CoreAppend", "#/$defs/CoreRewrite",
                                                          "#/$defs/CoreNone"]
    assert not compiler.accepts(empty, ok)


# ------------------------------------------------------------------ finding 10


def test_f10_an_expert_file_of_another_conversation(tiny_model_dir, tmp_path, capsys):
    from data_synth.datasets import load_conversations
    from data_synth.extractors import ExtractorCoverageError, make_extractor

    conv = load_conversations("locomo", ids=["conv-26"], n_sessions=2)
    with pytest.raises(ExtractorCoverageError, match=r"^expert:conv-30.jsonl holds trajectories of conv-30, none of "
                                                     r"conv-26: pass expert:conv-26 \(if that file exists\) or "
                                                     r"evaluate conv-30$"):
        make_extractor("expert:conv-30", None, conversations=conv)
    assert make_extractor("expert:conv-26", None, conversations=conv).name == "expert:conv-26.jsonl"
    rc = memgym(["eval", "--conversations", "conv-26", "--n_sessions", "2", "--max_questions", "3", "--extractor",
                 "expert:conv-30", "--scorer", "answer-recall", "--answer_model", f"hf:{tiny_model_dir}",
                 "--out", str(tmp_path / "ev"), "--no_progress", "--cache", "none"])
    assert rc == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memgym eval")]
    assert err == ["memgym eval: expert:conv-30.jsonl holds trajectories of conv-30, none of conv-26: pass "
                   "expert:conv-26 (if that file exists) or evaluate conv-30"]


# ------------------------------------------------------------------ finding 11


def _beam_chat(tmp_path: Path, chat=None, questions=None) -> Path:
    src = data_root() / "beam" / "100K" / "3"
    dst = tmp_path / "beam" / "100K" / "3"
    shutil.copytree(src, dst)
    if chat is not None:
        (dst / "chat.json").write_text(json.dumps(chat))
    if questions is not None:
        (dst / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions))
    return dst


@pytest.mark.parametrize("chat, questions, what", [
    ([], None, "chat.json, record -, field -: the chat holds no batches (an empty list): nothing to remember"),
    (None, {}, "probing_questions.json, record -, field -: no probing questions (an empty object or only empty "
               "lists): nothing to score"),
    (None, {"temporal_reasoning": []}, "probing_questions.json, record -, field -: no probing questions"),
])
def test_f11_an_empty_beam_chat_or_question_file_is_refused(tmp_path, chat, questions, what):
    from data_synth.beam import load_beam_chat
    from data_synth.errors import DataFormatError

    folder = _beam_chat(tmp_path, chat, questions)
    with pytest.raises(DataFormatError) as e:
        load_beam_chat(folder)
    assert what in str(e.value)


def test_f11_beam_selection_checks(tmp_path):
    from data_synth.datasets import check_selection, load_conversations

    folder = _beam_chat(tmp_path)
    for default in (["conv-30"], ["conv-26", "conv-30"]):  # the eval / program-eval recipe defaults
        convs = list(default)
        check_selection("beam", str(folder), convs, None, "rubric-recall")
        assert convs == ["100K-3"]  # the folder's chat, not the LoCoMo ids
    assert [c.id for c in load_conversations("beam", str(folder), ids=convs)] == ["100K-3"]
    size_folder = folder.parent
    convs = ["conv-30"]
    check_selection("beam", str(size_folder), convs, None, "answer-recall")
    assert convs == ["100K-3"]
    with pytest.raises(ConfigError, match=r"^--split train and --conversations 100K-4 both given: the split runs its "
                                          r"own ids and would ignore the conversations; give one of them$"):
        check_selection("beam", None, ["100K-4"], "train", "answer-recall")
    with pytest.raises(ConfigError, match=r"^--split test: none of its BEAM chats is under .*100K/3 \(found there: "
                                          r"100K-3\); nothing would be evaluated$"):
        check_selection("beam", str(folder), ["conv-30"], "test", "answer-recall")
    check_selection("beam", str(folder), ["conv-30"], "train", "answer-recall")  # 100K-3 is a train chat
    with pytest.raises(ConfigError, match="^--conversations is empty: nothing would be evaluated$"):
        check_selection("locomo", None, [], None, "answer-recall")
    with pytest.raises(ConfigError, match="^--split valid and --conversations conv-42 both given"):
        check_selection("locomo", None, ["conv-42"], "valid", "f1")


def test_f11_program_eval_on_a_beam_folder_defaults_to_its_chats(tmp_path):
    from memory_bank.programs import seed_program_path

    folder = _beam_chat(tmp_path)
    out = tmp_path / "pe"
    rc = memgym(["program", "eval", str(seed_program_path()), "--dataset", "beam", "--path", str(folder),
                 "--n_sessions", "1", "--max_questions", "2", "--extractor", "turns", "--plan_mode", "question",
                 "--scorer", "rubric-recall", "--no_diagnostics", "--no_validate", "--stage_cache", "none",
                 "--cache", str(tmp_path / "r.sqlite"), "--no_progress", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["conversations"] == ["100K-3"] and rep["n"] == 2


# ------------------------------------------------------------------ finding 12


@pytest.mark.parametrize("argv, message", [
    (["retrieval", "--sizes", "100000000"], "argument --sizes: must be between 1 and 5,000,000, got 100000000"),
    (["cases", "--max-cases", "0"], "argument --max-cases: must be between 1 and 100,000, got 0"),
    (["cases", "--conversations", "conv-99"], "argument --conversations: unknown LoCoMo conversation 'conv-99'; "
                                              "known: conv-26, conv-30, conv-41, conv-42, conv-43, conv-44, conv-47, "
                                              "conv-48, conv-49, conv-50"),
    (["reuse", "--conversations", "conv-41"], "argument --conversations: conversation 'conv-41' has no expert "
                                              "trajectory in "),
    (["round", "--valid", "conv-7"], "argument --valid: unknown LoCoMo conversation 'conv-7'"),
    (["constrained", "--batch-size", "0"], "argument --batch-size: must be between 1 and 256, got 0"),
    (["constrained", "--rounds", "0"], "argument --rounds: must be between 1 and 100, got 0"),
    (["reward", "--n", "-3"], "argument --n: must be between 1 and 100,000, got -3"),
    (["train", "--reps", "0"], "argument --reps: must be between 1 and 1,000,000, got 0"),
    (["sandbox", "--starts", "0"], "argument --starts: must be between 1 and 10,000, got 0"),
])
def test_f12_bench_arguments_are_checked_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        memgym(["bench", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"memgym bench {argv[0]}: error: {message}"), err


def test_f12_retrieval_sizes_beyond_the_memory_are_refused_before_work(capsys):
    from launch.bench.args import physical_memory_bytes

    gib = physical_memory_bytes() / 2**30
    assert memgym(["bench", "retrieval", "--sizes", "5000000", "--dim", "8192"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"memgym bench retrieval: --sizes 5,000,000 x --dim 8192 needs about 457.8 GiB, more than half of this "
                   f"machine's {gib:.1f} GiB: use smaller sizes")
