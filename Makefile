# LLM Serving Lab — two commands: `make lab` opens the course, `make test` passes its tests.
#
#   make setup        everything every lab needs in CPU mode: course environment (.venv), course
#                     model, Triton server environment (.venv-triton); starts nothing
#   make lab          the environment and the course model, then JupyterLab on 127.0.0.1 in labs/;
#                     the rest of setup is built in the background meanwhile (see LATER below)
#   make check LAB=NN one lab's public checks on labs/NN_*.ipynb, run in CPU mode without servers
#   make test         setup + Triton server environment + test tools, then the whole suite in two
#                     pytest processes at once (scripts/test_streams.py; PYTEST_ARGS=--serial: one)
#   make test-fast    the suite without the slow tests (no servers, no notebooks)
#   make labs         regenerate labs/ from solutions/ (and strip outputs)
#   make triton-env   the Triton server's own environment (.venv-triton; it needs numpy<2)
#
# GPU lab machine: `make setup GPU=1` installs requirements/course-gpu.txt (CUDA torch and the
# official vllm package) instead of requirements/course-cpu.txt.
#   make gpu-check    on an NVIDIA machine: install the GPU environment, run labs 00-05 in GPU mode,
#                     print a summary (out/gpu-check/); without a GPU: the checks a CPU can do

PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
GPU         ?=
REQS        := requirements/course-$(if $(GPU),gpu,cpu).txt
STAMP       := $(VENV)/.installed-$(if $(GPU),gpu,cpu)
LAB_PORT    ?= 8888
PYTEST_ARGS ?=

.PHONY: setup lab lab-stop check test test-fast labs model draft moe reasoning adapters prometheus venv triton-venv triton-env sandbox test-tools clean-venv gpu-check release

# bubblewrap (Debian's `bubblewrap`): the grader runs every learner's code inside it (grader/sandbox.py).
# Installed as root with apt (scripts/apt_tool.sh, as for every system tool); elsewhere the grader says what to install.
sandbox:
	@bash scripts/apt_tool.sh bwrap bubblewrap "the grader refuses to grade without --no-sandbox"
# (a learner's copy has no sandbox target: scripts/release.py drops this paragraph, and so the name)
GRADER_LATER := sandbox

# What `make lab` builds in the background after lab 00 can run, one target at a time, in the order
# of the labs that use them (lab_utils/background.py; log in out/setup-background/build.log).
LATER := draft triton-env adapters prometheus moe reasoning $(GRADER_LATER)

# Every lab's set-up in CPU mode; idempotent (a second run takes seconds). `python -m lab_utils.setup`
# reports the same steps, and a lab's setup cell offers to run a missing one from the notebook.
setup: venv model $(LATER)
	@$(PY) -m lab_utils.setup

# Lab 12's real Prometheus (Debian's `prometheus`, 2.42), installed like bubblewrap; without it the
# PromQL tests (tests/test_multi_tenant_slow.py) are skipped and say so.
prometheus:
	@bash scripts/apt_tool.sh prometheus prometheus "lab 12 skips its Prometheus section (and the PromQL tests are skipped)"

venv: $(STAMP)

# Re-runs only when the requirements or the package metadata change; otherwise make skips it.
$(STAMP): $(REQS) pyproject.toml scripts/install_course_env.sh
	bash scripts/install_course_env.sh "$(PYTHON)" "$(VENV)" "$(REQS)"
	touch $@

model: venv
	$(PY) -m lab_utils.models

# Labs 04/05's draft model for speculative decoding: 4 of the course model's layers, distilled on its
# own replies with torch on CPU (about 4 minutes on 2 cores; cached, a second run takes a second).
draft: model
	$(PY) -m lab_utils.draft

# Lab 13's course MoE: the course model upcycled into 4 experts, top-2 (about 20 s, 0.8 GB in bf16).
moe: model
	$(PY) -m lab_utils.moe

# Lab 15's reasoning model: the course model fine-tuned on course-made examples to think and call
# tools (lab_utils/reasoning; a few minutes on 2 cores, longer on a busy machine).
reasoning: model
	$(PY) -m lab_utils.reasoning

# Lab 12's LoRA adapters, trained on the course model with peft (one to two minutes each on 2 busy cores).
# The json adapter is also merged into a full copy of the weights (seconds), for the merged-model comparison.
adapters: model
	$(PY) -m lab_utils.lora

# The Triton server runs in its own environment: nvidia-pytriton pins numpy<2, the course
# environment has numpy 2. scripts/triton_env.sh is idempotent and needs only python3 (triton-venv);
# the python backend is laid out with the course environment's Python, so triton-env waits for venv.
triton-venv:
	bash scripts/triton_env.sh
triton-env: triton-venv venv
	@# lay out the python backend now, so a read-only view of .venv-triton (the grader's sandbox) serves
	$(PY) -c "from lab_utils.servers.triton import prepare_install; prepare_install()"

# Debian's docker-compose (1.29) validates compose files without a Docker engine.
# Debian's chromium runs the labs' widgets in JupyterLab for tests/test_browser.py (driven by playwright,
# which is in the requirements; its own browser download is not used).
test-tools:
	@bash scripts/apt_tool.sh docker-compose docker-compose "compose files are checked by schema only"
	@[ -x /usr/lib/chromium/chromium ] || bash scripts/apt_tool.sh chromium chromium "the browser test (tests/test_browser.py) is skipped"
	@if [ "$$(id -u)" = 0 ]; then bash docker/hub/hub.sh install >/dev/null \
	  || echo "note: the class hub did not install; tests/test_class_hub.py's flow test is skipped"; \
	 else echo "note: not root, so the class hub (real unix users) is not installed; its flow test is skipped"; fi

# JupyterLab refuses to run as root unless told; containers and lab VMs often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

# Lab 00 needs only the environment and the course model: JupyterLab opens as soon as they are ready,
# and a background builder makes the rest (a second `make lab` finds it running and starts none).
# A lab that needs a step still being built says so in its setup cell, with the time left, and waits.
# When JupyterLab exits (Ctrl-C twice, or File > Shut Down) the builder is stopped too; what it had
# not finished is built by the next `make lab` or `make setup`.
LATER_MAKE := $(MAKE) --no-print-directory PYTHON=$(PYTHON) VENV=$(VENV)$(if $(GPU), GPU=$(GPU),)

lab: venv model
	@$(PY) -m lab_utils.background start $(LATER) --make "$(LATER_MAKE)"
	@trap '$(PY) -m lab_utils.background stop' EXIT; trap 'exit 130' INT TERM HUP; \
	 $(VENV)/bin/jupyter lab --ip 127.0.0.1 --port $(LAB_PORT) --no-browser $(ROOT_FLAG) --notebook-dir labs

# Stop the background set-up that `make lab` started (the step in progress is ended, except an apt install).
lab-stop:
	@$(PY) -m lab_utils.background stop

# A lab's public checks on your notebook, from a terminal: runs a copy of labs/NN_*.ipynb in CPU mode,
# LIGHT, without servers (lab_utils/grading/selfcheck.py), then prints each question's result.
check: venv
	@test -n "$(LAB)" || { echo "usage: make check LAB=NN [NB=path/to/notebook.ipynb]"; exit 2; }
	$(PY) -m lab_utils.grading.selfcheck $(LAB) $(if $(NB),--notebook "$(NB)",)

# The two environments first, at once: each pip install keeps one core busy (on a fresh clone, 2 cores:
# .venv 150 s and .venv-triton 60 s one after the other, 2026-12-07).
test:
	@$(MAKE) --no-print-directory -j2 venv triton-venv
	@$(MAKE) --no-print-directory setup test-tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m lab_utils.nbgen --check
	$(PY) scripts/test_streams.py -ra --durations=25 $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -ra -m "not slow" $(PYTEST_ARGS)

# Any Python starts it: without a GPU it continues in .venv (created if missing); with one it
# installs the GPU environment itself. GPU_CHECK_ARGS: --budget S, --labs 00,01|all, --skip-install.
gpu-check:
	@if [ -x $(PY) ]; then $(PY) scripts/gpu_check.py $(GPU_CHECK_ARGS); \
	 else $(PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS); fi

labs: venv
	$(PY) -m lab_utils.nbgen --strip

clean-venv:
	rm -rf $(VENV) .venv-triton

# The learner's copy an instructor hands a class: labs, the learner side of lab_utils, set-up files;
# no solutions, no grader/ (hidden checks, references, judge), no tests. `make lab` works inside it.
release:
	@test -n "$(OUT)" || { echo "usage: make release OUT=DIR"; exit 2; }
	$(PYTHON) scripts/release.py "$(OUT)"

# A JupyterHub for a class on this machine, with nbgrader's exchange (docker/hub/; run as root).
# Not part of `make setup` or `make test`. HUB_USERS: the learners' unix names (or "$$(cat names.txt)").
#   make hub HUB_USERS="alice bob"   install the hub's venv (about 25 s), the course and the learners,
#                                    then run the hub on 127.0.0.1:8000 (Ctrl-C stops it)
.PHONY: hub
hub:
	bash docker/hub/hub.sh install
	bash docker/hub/hub.sh course
	@if [ -n "$(HUB_USERS)" ]; then bash docker/hub/hub.sh users $(HUB_USERS); fi
	HUB_USERS="$(HUB_USERS)" bash docker/hub/hub.sh start
