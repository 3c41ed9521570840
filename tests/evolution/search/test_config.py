"""The evolve recipes parse into EvolveConfig with the splits of docs/design.md § "Data model"; bad recipes fail clearly."""
from __future__ import annotations

from pathlib import Path

import pytest

from memgym.evolution.search.config import EvolveConfig

RECIPES = Path(__file__).resolve().parents[3] / "launch" / "recipes"


def _parse(name: str, *extra: str) -> EvolveConfig:
    from trl import TrlParser

    return TrlParser(dataclass_types=[EvolveConfig]).parse_args_and_config(
        args=["--config", str(RECIPES / name), *extra])[0]


def test_offline_recipe_has_the_design_splits_and_runs_without_models():
    cfg = _parse("evolve_locomo_offline.yaml")
    assert (cfg.train, cfg.valid) == (["conv-26", "conv-30"], ["conv-41", "conv-42"])
    assert cfg.test == ["conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"]
    assert (cfg.extractor, cfg.plan_mode, cfg.scorer, cfg.proposer, cfg.rounds_integrate) == \
        ("turns", "question", "grounded-recall", "params", 0)
    assert (RECIPES / "evolve_locomo_offline.yaml").read_text().startswith("# Offline")
    over = _parse("evolve_locomo_offline.yaml", "--rounds_refine", "2", "--workers", "2", "--out", "/tmp/x")
    assert (over.rounds_refine, over.workers, over.out) == (2, 2, "/tmp/x")


def test_coder_recipes_name_servers_and_the_judge():
    lo = _parse("evolve_locomo_coder.yaml")
    assert lo.proposer == "coder" and lo.coder_model.startswith("openai:") and lo.scorer == "llm"
    for name, ds in (("evolve_locomo_coder.yaml", "locomo"), ("evolve_longmemeval_coder.yaml", "longmemeval"),
                     ("evolve_beam_coder.yaml", "beam")):  # annotator labels, made by the header's memgym annotate
        assert _parse(name).labels == f"runs/labels_{ds}.jsonl"
        assert f"memgym annotate --dataset {ds} --split valid" in (RECIPES / name).read_text()
    lme = _parse("evolve_longmemeval_coder.yaml")
    assert (len(lme.train), len(lme.valid), len(lme.test)) == (52, 47, 100)
    assert lme.data_path().endswith("longmemeval_s_subset.json")


@pytest.mark.parametrize("kw, msg", [
    (dict(proposer="coder"), "needs --coder_model"), (dict(proposer="scripted"), "needs --script"),
    (dict(dataset="mmlu"), "--dataset: 'mmlu' is not one of locomo, longmemeval, beam"),
    (dict(rounds_cold=-1), "--rounds_cold: must be >= 0, got -1"),
    (dict(train=["conv-26"], valid=["conv-26"]), "splits overlap"), (dict(embedder="bert"), "is not one of: minilm"),
    (dict(extractor=""), "--extractor: expected a spec string"), (dict(workers=0), "--workers: must be >= 1, got 0"),
    (dict(task_model="gguf:/x"), "--task_model"),
])
def test_bad_recipes_fail_with_the_field_named(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EvolveConfig(**kw)


def test_evolve_empty_test_means_no_test_run():
    from memgym.evolution.search.config import EvolveConfig

    cfg = EvolveConfig(test=[""], embedder="hash:64")
    assert cfg.test == [] and cfg.train == ["conv-26", "conv-30"]


def test_beam_and_longmemeval_recipes_take_the_design_splits():
    off = _parse("evolve_beam_offline.yaml")
    assert (len(off.train), len(off.valid), len(off.test)) == (8, 6, 8) and off.test[0] == "1M-3"
    assert (off.extractor, off.scorer, off.proposer, off.context_tokens, off.integrate_onto) == \
        ("turns", "grounded-recall", "params", 2048, "best")
    assert (off.rounds_cold, off.rounds_refine, off.rounds_integrate) == (3, 2, 1)  # the header's measured cost
    assert off.baselines == ["full_history", "bm25", "dense_topk", "hybrid_rrf", "reference"]
    assert off.dataset == "beam" and off.context_tokens == 2048
    coder = _parse("evolve_beam_coder.yaml")
    assert (coder.dataset, coder.scorer, coder.proposer) == ("beam", "llm", "coder") and coder.judge_model
    lme = _parse("evolve_longmemeval_offline.yaml")
    assert (len(lme.train), len(lme.valid), len(lme.test)) == (52, 47, 100) and lme.context_tokens == 1024
    demo = _parse("demo_evolve.yaml")
    assert demo.context_tokens == 1024 and demo.baselines == ["full_history", "bm25", "dense_topk", "hybrid_rrf"]
    with pytest.raises(ValueError, match="unknown baseline program"):
        EvolveConfig(baselines=["bm26"])


def test_recipe_lists_are_deduplicated_in_order_with_a_note():
    with pytest.warns(UserWarning, match=r"--baselines: 3,000 repeated item\(s\) dropped"):
        cfg = EvolveConfig(baselines=["bm25"] * 3000 + ["full_history", "bm25"], embedder="hash:64")
    assert cfg.baselines == ["bm25", "full_history"]
    with pytest.warns(UserWarning, match=r"--test: 1 repeated item\(s\) dropped"):
        cfg = EvolveConfig(test="conv-43,conv-44,conv-43", embedder="hash:64")
    assert cfg.test == ["conv-43", "conv-44"]


def test_recipe_lists_are_bounded_when_parsed(tmp_path):
    from memgym.llm.checks import MAX_LIST_ITEMS
    from memgym.llm.errors import ConfigError

    assert MAX_LIST_ITEMS == 10_000
    with pytest.raises(ConfigError, match=r"--baselines: 1,000,000 items, more than the bound of 10,000 items"):
        EvolveConfig(baselines=["bm25"] * 10**6, embedder="hash:64")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("embedder: hash:64\nbaselines:\n" + "  - bm25\n" * 10_001)
    with pytest.raises(ConfigError, match=r"--baselines: 10,001 items, more than the bound of 10,000"):
        _parse(str(recipe))
