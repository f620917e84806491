# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On these machines torch==2.13.0 resolves to the CPU wheel on local disk; override for others.
TORCH_SPEC ?= torch==2.13.0
NNODES ?= 64

.PHONY: setup demo test lint bench clean

# The native code (controller/native, neuronabox/schedules/native) is built by pip through pyproject's backend;
# the NCCL plugins (nccl_patch/, plain C, gcc only) by their own Makefile, here and on every `make setup`.
$(BIN)/neuronabox: pyproject.toml $(wildcard controller/native/*.h controller/native/*.cc neuronabox/schedules/native/*.h neuronabox/schedules/native/*.cc)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	$(MAKE) -C nccl_patch
	touch $@

setup: $(BIN)/neuronabox
	$(MAKE) -C nccl_patch

demo: setup
	$(BIN)/neuronabox torchrun --nnodes $(NNODES) --nproc-per-node 1 examples/train_ddp.py --steps 5

# Two workers, one a core: one takes 510-606 s here (docs/reliability.md, "Two workers").
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: setup
	$(BIN)/python scripts/bench_allreduce.py

clean:
	rm -rf $(VENV) build *.egg-info
	$(MAKE) -C nccl_patch clean
