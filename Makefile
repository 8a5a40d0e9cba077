# The two commands of the README: `make demo` and `make test`. Both build .venv first when it is missing
# or older than the files that define it.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP_QUIET := --quiet --disable-pip-version-check

.PHONY: setup demo test test-matrix test-unit test-fast bench docs lint lock clean gpu-wheels gpu-check

setup: $(STAMP)

# The project (editable) with every extra (.[all]: serve, azure, notebook, test, tracking, docs, lint), every version
# fixed by constraints.txt (torch==2.13.0 is the CPU build found on this machine; anything else pulls several GB of
# CUDA wheels). The installer is uv (`uv pip install`, the same command line as pip's: 6 to 7.5 minutes for the whole
# setup with pip, 1.5 to 3.5 with uv, from empty caches on this loaded machine; docs/CONTRIBUTING.md), itself
# from PyPI, put in the venv by pip at the version constraints.txt pins. uv reads neither pip.conf nor PIP_* variables,
# so it is given the package sources pip itself would use (PIP_SOURCES: here the CPU torch wheel in /opt/wheels and
# the local mirrors beside PyPI) and pip's rule among them (the best version from any source: unsafe-best-match).
# Bytecode is compiled at install, as pip does (--compile-bytecode on both installs: uv compiles what each installs):
# where PYTHONDONTWRITEBYTECODE is set, as on these machines, nothing is cached on import, and every process that
# imports torch, DeepSpeed and papermill would compile them again (8.2 s of CPU against 4.6 s here).
UV := $(VENV)/bin/uv
PIP_SOURCES := $(PY) -c "from pip._internal.commands import create_command; o, _ = create_command('install').parse_args([]); \
  print(*['--index-url=' + o.index_url], *['--extra-index-url=' + u for u in o.extra_index_urls], *['--find-links=' + f for f in o.find_links])"
UV_INSTALL := $(UV) pip install --quiet --python $(PY) --index-strategy unsafe-best-match $$($(PIP_SOURCES)) --compile-bytecode -c constraints.txt
# DeepSpeed compiles its shared-memory comm op on first use (~35 s on an idle machine, kept in .venv/torch_extensions):
# it is built here, so the first DeepSpeed run (the doctor's, in the demo) does not pay for it; with the checkout's
# toolkit, as soon as torch and DeepSpeed are in, while the rest installs and the imports are checked.
# DeepSpeed as every process here imports it: its accelerator named (no "Setting accelerator to CPU" guess)
IMPORT_DEEPSPEED := from toolkit.third_party import import_deepspeed; import_deepspeed()
SHM_OP := $(IMPORT_DEEPSPEED); from deepspeed.comm.torch import build_shm_op; build_shm_op()

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) -c constraints.txt uv > $(VENV)/pip.log 2>&1 \
	  || { grep -v "is ignored: it is neither" $(VENV)/pip.log | tail -40; exit 1; }
	$(UV_INSTALL) torch deepspeed > $(VENV)/uv.log 2>&1 || { tail -40 $(VENV)/uv.log; exit 1; }
	$(PY) -c "$(SHM_OP)" > $(VENV)/shm_op.log 2>&1 & shm=$$!; \
	$(UV_INSTALL) -e ".[all]" >> $(VENV)/uv.log 2>&1 \
	  || { tail -40 $(VENV)/uv.log; kill $$shm; exit 1; }; \
	$(PY) -c "import torch, papermill, toolkit; $(IMPORT_DEEPSPEED)" || { kill $$shm; exit 1; }; \
	wait $$shm || { tail -20 $(VENV)/shm_op.log; exit 1; }
	touch $(STAMP)

# The checkout's own packages, compiled as the installs compile theirs (see above), before every demo and test run:
# each process those start imports them again (the CLI, the supervisor, every rank, every kernel). Only what changed
# since the last run is compiled again.
BYTECODE := $(PY) -m compileall -q toolkit widgets

demo: $(STAMP)
	$(BYTECODE)
	$(PY) -m toolkit.report.demo

# DeepSpeed's CPU Adam (ZeRO-Offload's optimizer, tests/e2e/test_cpu_adam.py, in the matrix: it runs DeepSpeed's op
# and none of our code) is JIT-built into .venv/torch_extensions the first time it loads: a minute or two of CPU. On a
# fresh venv `make test-matrix` starts that build beside its tests, at the lowest priority, in the cycles they leave
# idle; the test runs last (tests/conftest.py) and finds the op built, or waits for it on torch's build lock.
CPU_ADAM_SO := $(VENV)/torch_extensions/cpu_adam/cpu_adam.so
CPU_ADAM_OP := $(IMPORT_DEEPSPEED); from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()

# One pytest worker per core (pytest-xdist), each pinned to its core by tests/conftest.py.
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -n auto -m "not matrix"

# Behaviours `make test` proves, again in configurations that differ only in what is handed to a library (marker
# `matrix`: the golden resume with accumulation, DeepSpeed twins, a model family, DeepSpeed's CPU Adam). CI runs it
# after `make test`; docs/CONTRIBUTING.md says which test goes where.
test-matrix: $(STAMP)
	$(BYTECODE)
	test -e $(CPU_ADAM_SO) || { nice -n 19 $(PY) -c "$(CPU_ADAM_OP)" > $(VENV)/cpu_adam_op.log 2>&1 & }
	$(PY) -m pytest -n auto -m matrix

# Pure logic only (no subprocess, no training): seconds.
test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

# The unit tier, then the smoke tests (the journey once: train, kill and resume, export and serve): ~100 s of CPU.
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit
	$(PY) -m pytest tests/e2e -m smoke

# The docs site (docs/mkdocs.yml): the generated reference pages must match the code, then a --strict build (a broken
# link, anchor, nav entry or snippet fails it) into docs/build/site/, ignored by git. NO_MKDOCS_2_WARNING: Material's
# end-of-life notice (May 2027; its successor is Zensical), printed on every build, is left out.
DOCS_SITE := docs/build/site

docs: $(STAMP)
	$(PY) docs/generate.py --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -f docs/mkdocs.yml -d $(CURDIR)/$(DOCS_SITE)

# ruff (lint and format: pyproject.toml [tool.ruff]) and mypy (types: [tool.mypy]) over toolkit/ and widgets/;
# `.venv/bin/python -m ruff format toolkit widgets` rewrites what the format check refuses.
lint: $(STAMP)
	$(PY) -m ruff check toolkit widgets
	$(PY) -m ruff format --check toolkit widgets
	$(PY) -m mypy

# Each bench also writes its figures as records (bench/figures.py) into bench/records/, ignored by git; the last line
# renders them all into the docs site's page of measured figures, docs/pages/figures.md, which is committed.
bench: $(STAMP)
	$(PY) bench/bench_training.py
	$(PY) bench/bench_compile.py
	$(PY) bench/bench_checkpoint.py
	$(PY) bench/bench_data.py
	$(PY) bench/bench_doctor.py
	$(PY) bench/bench_serving.py
	$(PY) bench/bench_hf.py
	$(PY) bench/bench_lora.py
	$(PY) bench/bench_packing.py
	$(PY) bench/bench_dpo.py
	$(PY) bench/bench_model_parallel.py
	$(PY) bench/bench_accumulation.py
	$(PY) bench/bench_activation_checkpointing.py
	$(PY) bench/bench_scaling.py
	$(PY) bench/bench_zero.py
	$(PY) bench/bench_fsdp.py
	$(PY) bench/bench_memory.py
	$(PY) bench/bench_mlflow.py
	$(PY) bench/bench_watchdog.py
	$(PY) bench/bench_startup.py
	$(PY) bench/figures.py --page docs/pages/figures.md

# The GPU machine's prepared check (docs/pages/gpu.md, "The prepared GPU check"). gpu-wheels, here (PyPI reachable):
# the wheels its image lacks, for Python 3.12, into .whl/ (ignored; copy it there with the tree). gpu-check, there: install them, run the
# GPU tier and a short benchmark, and write gpu_check.md and .json into $OUT (default: a dated folder under bench/results/); on the
# image's python3, or .venv's where there is one (here: a dry run, "no CUDA device").
gpu-wheels:
	bash bench/gpu_wheels.sh

gpu-check:
	PYTHON="$${PYTHON:-$(if $(wildcard $(PY)),$(PY),python3)}" bash bench/gpu_check.sh

# Re-pin every dependency to what is installed now (after changing pyproject.toml and running setup), then write
# environment.yml, the Azure ML job and serving images' environment, from the new lock.
lock: $(STAMP)
	{ sed -n '1,3p' constraints.txt; $(PY) -m pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu/torch==2.13.0/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	$(PY) -m toolkit.resources.job_environment

clean:
	rm -rf runs outputs .pytest_cache
