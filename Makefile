# hvdcls: `make demo` and `make test` are all a fresh machine needs; both run `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python
GPU ?= 0
# Docker: where no registry answers, `make base-image` builds BASE_IMAGE from Debian's packages.
BASE_IMAGE ?= $(if $(filter 1,$(GPU)),nvidia/cuda:13.0.1-cudnn-devel-ubuntu22.04,hvdcls/base:bookworm)
IMAGE ?= $(if $(filter 1,$(GPU)),hvdcls:gpu,hvdcls:latest)
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
PROJECT ?= hvdcls
# The Slurm cluster in compose (docker/slurm.yaml): its image starts FROM $(IMAGE).
SLURM_IMAGE ?= hvdcls-slurm:latest
SLURM_PROJECT ?= hvdcls-slurm
# The compose cluster's Prometheus (docker/prometheus/): Debian's package FROM $(BASE_IMAGE).
PROMETHEUS_IMAGE ?= hvdcls-prometheus:latest
GPU_FLAG := $(if $(filter 1,$(GPU)),--gpu,)

.PHONY: setup demo test lint doctor unit parallel docker-test clean distclean bench docker-engine base-image \
	wheelhouse image prometheus-image compose-up compose-down compose-test slurm-image slurm-up slurm-down \
	bench-unequal test-images

setup:
	@VENV=$(VENV) GPU=$(GPU) bash tools/setup.sh

demo: setup
	@$(PY) -m hvdcls demo

# The Docker tests need an engine: started here when none answers (as root), else they skip
# (and fail under CI=true).
# Every test, after the linters. The single-process suites (no ranks launched) run on
# TEST_WORKERS cores with pytest-xdist; the parallel and Docker suites launch 2-rank jobs that
# take both cores themselves, so they follow one test at a time: the second run is every test
# but the first's, so a new folder lands there by default. It goes on when the first failed, and
# make fails if either did; each closes with its slowest tests (CI's budget).
# The Docker images the Docker suite needs are built meanwhile, in the background (their apt
# downloads and layer writes wait on the network and the disk, not the cores); the Docker
# tests' fixtures find them up to date, or build what a failed background build left.
# BESIDE: parallel tests that mostly wait, run beside the single-process suites instead of after
# them (in that order, one at a time). Each kept the cores under 2/3 busy when run alone
# (2026-12-07, docs/testing.md#measured): the service's crash rounds (stand-in jobs that
# sleep), its fuzzed API (one slot held by an idle job), its full disk, Slurm's daemons, the
# installation's checks and tools/gpu_check.sh's CPU mode (one process at a time).
TEST_WORKERS ?= 2
SINGLE_PROCESS_SUITES := tests/unit tests/torch_backend tests/tf_backend
BESIDE := $(addprefix tests/parallel/,test_serve_crash.py test_serve_api.py test_serve_disk.py test_slurm.py \
	test_installation.py test_gpu_check.py)
test: setup lint
	@bash tools/docker_engine.sh --try
	@status=0; images=; mkdir -p build; \
	if docker info >/dev/null 2>&1; then \
		echo "[test] building the Docker images in the background (log: build/test-images.log)"; \
		$(MAKE) --no-print-directory test-images >build/test-images.log 2>&1 & images=$$!; \
	fi; \
	echo "[test] $(BESIDE) beside the single-process suites (log: build/beside.log)"; \
	$(PY) -m pytest --durations=8 $(BESIDE) >build/beside.log 2>&1 & beside=$$!; \
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=10 $(SINGLE_PROCESS_SUITES) || status=$$?; \
	wait $$beside || status=$$?; cat build/beside.log; \
	if [ -n "$$images" ]; then \
		started=$$(date +%s); wait $$images && echo "[test] Docker images ready (waited $$(( $$(date +%s) - started )) s)" \
			|| echo "[test] the background image build failed (build/test-images.log); the Docker tests build again"; \
	fi; \
	$(PY) -m pytest --durations=25 $(addprefix --ignore=,$(SINGLE_PROCESS_SUITES) $(BESIDE)) tests || status=$$?; \
	exit $$status

# What tests/docker's fixtures use: the app image, the compose cluster's Prometheus, Slurm's.
test-images: image prometheus-image slurm-image

# ruff (ruff.toml) and mypy (mypy.ini) over the code that ships; tests/ are not linted yet.
LINTED := hvdcls torch_backend tf_backend tools benchmarks setup.py
lint: setup
	@$(VENV)/bin/ruff check $(LINTED)
	@$(VENV)/bin/mypy

# Parts of the suite: no framework launch / real ranks under horovodrun and mpirun / Docker.
unit: setup
	@$(PY) -m pytest -n $(TEST_WORKERS) tests/unit

parallel: setup
	@$(PY) -m pytest --durations=10 tests/parallel

docker-test: compose-test

docker-engine:
	@bash tools/docker_engine.sh

base-image: docker-engine
	@BASE_IMAGE=$(BASE_IMAGE) bash tools/base_image.sh

# Every wheel the image installs, in build/docker/wheelhouse (the Horovod wheel from the cache).
wheelhouse: setup
	@$(PY) tools/docker_image.py wheelhouse $(GPU_FLAG)

image: setup base-image
	@$(PY) tools/docker_image.py image $(GPU_FLAG) --base-image $(BASE_IMAGE) --tag $(IMAGE)

prometheus-image: setup base-image
	@$(PY) tools/docker_image.py prometheus-image --base-image $(BASE_IMAGE) --tag $(PROMETHEUS_IMAGE)

compose-up: image prometheus-image
	@HVDCLS_IMAGE=$(IMAGE) HVDCLS_PROMETHEUS_IMAGE=$(PROMETHEUS_IMAGE) \
		$(COMPOSE) -f docker/compose.yaml -p $(PROJECT) up --detach
	@$(COMPOSE) -f docker/compose.yaml -p $(PROJECT) exec -T launcher hvdcls-container wait-workers
	@$(COMPOSE) -f docker/compose.yaml -p $(PROJECT) exec -T launcher hvdcls-container wait-service

compose-down:
	@$(COMPOSE) -f docker/compose.yaml -p $(PROJECT) down --volumes --remove-orphans --timeout 5

# A Slurm controller, two compute nodes and `hvdcls serve --executor slurm` (docs/serve.md).
slurm-image: image
	@$(PY) tools/docker_image.py slurm-image --app-image $(IMAGE) --tag $(SLURM_IMAGE)

slurm-up: slurm-image
	@HVDCLS_SLURM_IMAGE=$(SLURM_IMAGE) $(COMPOSE) -f docker/slurm.yaml -p $(SLURM_PROJECT) up --detach
	@$(COMPOSE) -f docker/slurm.yaml -p $(SLURM_PROJECT) exec -T service hvdcls-slurm wait-ready

slurm-down:
	@$(COMPOSE) -f docker/slurm.yaml -p $(SLURM_PROJECT) down --volumes --remove-orphans --timeout 5

# Both backends under mpirun across the compose workers, a job through its service; tears down after.
compose-test: setup docker-engine
	@HVDCLS_REQUIRE_DOCKER=1 HVDCLS_IMAGE=$(IMAGE) HVDCLS_PROMETHEUS_IMAGE=$(PROMETHEUS_IMAGE) $(PY) -m pytest tests/docker

# Step throughput: the default matrix beside DDP and raw Horovod -> runs/bench/bench.{json,md,png}
bench: setup
	@$(PY) -m hvdcls bench --rounds 2 --output-dir runs/bench

# training.balance off vs dynamic, both backends, 4 ranks across compose workers capped at 1 and
# 0.5 cores (docker/compose.unequal.yaml) -> runs/bench-unequal/bench.{json,md,png}; tears down after
bench-unequal: image
	@$(PY) tools/bench_unequal.py --image $(IMAGE) --project $(PROJECT)-unequal --output-dir runs/bench-unequal

doctor: setup
	@$(VENV)/bin/hvdcls doctor

clean:
	rm -rf build *.egg-info .pytest_cache runs
	find . -name __pycache__ -prune -exec rm -rf {} +

# Also drops the virtual environment; the cached Horovod wheel (~/.cache/hvdcls) stays.
distclean: clean
	rm -rf $(VENV)
