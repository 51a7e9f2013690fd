# hvdcls: `make demo` and `make test` are all a fresh machine needs; both run `make setup`.
VENV ?= .venv
PY := $(VENV)/bin/python
GPU ?= 0

.PHONY: setup demo test doctor unit parallel clean distclean

setup:
	@VENV=$(VENV) GPU=$(GPU) bash tools/setup.sh

demo: setup
	@$(PY) -m hvdcls demo

test: setup
	@$(PY) -m pytest tests

unit: setup
	@$(PY) -m pytest tests/unit

parallel: setup
	@$(PY) -m pytest tests/parallel

doctor: setup
	@$(VENV)/bin/hvdcls doctor

clean:
	rm -rf build *.egg-info .pytest_cache runs
	find . -name __pycache__ -prune -exec rm -rf {} +

# Also drops the virtual environment; the cached Horovod wheel (~/.cache/hvdcls) stays.
distclean: clean
	rm -rf $(VENV)
