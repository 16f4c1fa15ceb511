# gradscope: `make demo` and `make test` do all the set-up on a fresh Debian machine.
BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
GS := $(BUILD)/gradscope
DEMO_OUT ?= demo-out
STUDY_OUT ?= results/cpu-tiny
STUDY_WORK ?= study-out
STUDY_RERUN ?= e0c8aeff3eaadd75
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 300
FUZZ_TARGET ?= all
SANITIZE_BUILD ?= build-sanitize
CUDA_BUILD ?= build-cuda
CUDA_VENV ?= .venv-cuda
# LibTorch is not instrumented: its leaks at exit and its globals are not ours to report.
SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

.PHONY: all deps data data-all configure build build-binary test test-fast test-sanitize fuzz fuzz-run demo \
  study study-rerun bench check-cuda clean format

all: build

VENV ?= .venv
# LibTorch's CMake files inside the environment's PyTorch wheel.
TORCH_DIR = $$($(VENV)/bin/python -c 'import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')

deps: $(VENV)/.requirements
	bash scripts/install-deps.sh

# The project's own Python environment with the pinned PyTorch (requirements.txt): gradscope
# builds against its LibTorch; the peers and golden-value scripts run on its torch.
$(VENV)/.requirements: requirements.txt
	bash scripts/python-env.sh $(VENV) requirements.txt

# The tokenizers, text corpora and emoji images the tests and the demo use.
data: deps
	bash scripts/fetch-data.sh tokenizers text emoji

# Every data set, the images included.
data-all: deps
	bash scripts/fetch-data.sh all

# Configured afresh whenever the environment changes (--fresh: no cached path of an earlier
# LibTorch survives into the new build, nor a cache option set by hand). Paths here (VENV,
# BUILD) must not hold spaces.
$(BUILD)/build.ninja: $(VENV)/.requirements
	cmake --fresh -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DTorch_DIR="$(TORCH_DIR)"

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The executable alone (what `make demo` needs): the tests take about half of a first build.
build-binary: configure
	cmake --build $(BUILD) -j $(JOBS) --target gradscope

test: data build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The fast tier: every suite but those that train for seconds or start gradscope processes
# (CTest label "fast"); about a minute of tests on two cores, for a quick check while working.
test-fast: data build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L fast

# The fast tier under AddressSanitizer and UBSan, in a build of its own ($(SANITIZE_BUILD));
# not part of CI (docs/testing.md).
# -O1 -g1: what the sanitizers advise, with line numbers in their reports.
$(SANITIZE_BUILD)/build.ninja: $(VENV)/.requirements
	cmake --fresh -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$(TORCH_DIR)" \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DGRADSCOPE_SANITIZE=address,undefined

test-sanitize: data $(SANITIZE_BUILD)/build.ninja
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	cd $(SANITIZE_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS) -L fast

# The libFuzzer targets of fuzz/ (clang, AddressSanitizer, UBSan) in $(FUZZ_BUILD); `make
# fuzz-run` runs each for FUZZ_TIME seconds (FUZZ_TARGET=idx: one) and merges what adds
# coverage into fuzz/corpus (docs/testing.md).
$(FUZZ_BUILD)/build.ninja: $(VENV)/.requirements
	bash scripts/install-deps.sh fuzz
	CXX=clang++ cmake --fresh -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$(TORCH_DIR)" \
	  -DGRADSCOPE_FUZZ=ON

fuzz: deps $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers

fuzz-run: fuzz
	FUZZ_BUILD=$(FUZZ_BUILD) bash scripts/fuzz.sh $(FUZZ_TARGET) $(FUZZ_TIME)

# The main job: the smoke sweep (the four models at their tiny presets x SGD and Adam x the
# three memory strategies x three seeds, each run in its own process; 72 runs, about 10-15
# minutes on two cores,
# resumable), then one longer run of the tiny Llama with its full summary: loss, time per
# phase, memory, throughput and FLOP/s; then the report of everything in the database.
# Results land in $(DEMO_OUT)/.
demo: data build-binary
	mkdir -p $(DEMO_OUT)
	$(GS) sweep configs/sweeps/smoke.toml --db $(DEMO_OUT)/gradscope.db | tee $(DEMO_OUT)/sweep.txt
	$(GS) run --model llama --preset tiny --optimizer adam --lr 3e-3 --batch 16 \
	  --steps 300 --warmup-steps 5 --eval-every 100 \
	  --db $(DEMO_OUT)/gradscope.db --json $(DEMO_OUT)/llama-tiny-adam.json \
	  --save-weights $(DEMO_OUT)/llama-tiny-weights > $(DEMO_OUT)/summary.txt
	@cat $(DEMO_OUT)/summary.txt
	$(GS) eval --model llama --preset tiny --batch 16 --eval-batches 8 \
	  --init-from $(DEMO_OUT)/llama-tiny-weights --json $(DEMO_OUT)/llama-tiny-eval.json
	$(GS) report $(DEMO_OUT)/gradscope.db --out $(DEMO_OUT)/report
	@echo "results: $(DEMO_OUT)/ (sweep.txt, summary.txt, the run record llama-tiny-adam.json, its weights llama-tiny-weights/ and their eval llama-tiny-eval.json, gradscope.db)"
	@echo "report:  $(DEMO_OUT)/report/report.html (figures, findings, recommendations; docs/reports.md)"

# The study asked properly on this machine (scripts/study.sh): first its learning rates, a grid
# of full-length runs at seed 100 (configs/sweeps/study-rates.toml: 208 runs), the lowest final
# validation loss picked per model, optimizer and step (scripts/study-rates.sh); then the
# comparison at those rates (configs/sweeps/study-cpu.toml: 290 runs, study-dropout.toml: 18,
# and the accumulation runs at their own rate where those differ: 29 in the committed study):
# 545 runs, about 80 minutes on two cores. Its report goes to $(STUDY_OUT) with made.md
# (command, commit, machine, each phase's wall time, the chosen rates), rates.md and the sweep
# files it ran: the committed folder, so `git diff` shows what a rerun changed. The databases
# and logs stay in $(STUDY_WORK): run again to resume a killed study, remove it to start over.
study: data build
	bash scripts/study.sh $(GS) $(STUDY_OUT) $(STUDY_WORK)

# One run of the study run again and compared bit for bit with $(STUDY_OUT) (its status,
# every step's loss, learning rate and gradient norm, the final losses); STUDY_RERUN is its id
# (the first column of runs.csv), found in the sweep files the report holds (sweeps/). Under a
# minute for most runs. Only on the LibTorch the report
# was made on (made.md names it); on another it says so and compares nothing.
study-rerun: data build
	bash scripts/study-rerun.sh $(GS) $(STUDY_OUT) $(STUDY_RERUN)

# The benchmarks (not tests: nothing fails on a slow machine): gradscope against PyTorch
# peers, the FLOP/s limit, fused against written-out attention, the strategies' costs, the
# sampler's overhead, the step of 2 ranks against 1 (ddp, zero2, fsdp), Gloo's collectives
# and the tiny study grid, as ratios over interleaved pairs in bench/results.md. 20 minutes
# on two cores with BENCH_FLAGS="--pairs 3" (the default is 5 pairs); "--only peers" and the
# like run less.
bench: data build
	bash scripts/install-deps.sh bench
	$(VENV)/bin/python bench/bench.py $(BENCH_FLAGS)

# The CUDA build, compiled and linked without a GPU: gradscope and its tests against the CUDA
# PyTorch wheel of requirements-cuda.txt (several GB, in $(CUDA_VENV)) and the machine's CUDA
# toolkit (nvcc of the wheel's CUDA major), in $(CUDA_BUILD): 7 minutes on two cores, after the
# environment's 80 s. CI runs it. The _CUDA tests need a GPU to run (scripts/gpu-check.sh
# runs them there).
check-cuda: deps $(CUDA_VENV)/.requirements
	bash scripts/check-cuda.sh $(CUDA_VENV) $(CUDA_BUILD) $(JOBS)

$(CUDA_VENV)/.requirements: requirements-cuda.txt
	bash scripts/python-env.sh $(CUDA_VENV) requirements-cuda.txt

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(SANITIZE_BUILD) $(CUDA_BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')
