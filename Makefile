# Two entry points for a fresh machine with nothing but Python >= 3.11:
#   make demo   create .venv, install, optimize a bundled sample model, print the summary
#   make test   create .venv, install, lint (ruff), type-check (mypy) and run the test suite
# torch is installed first and pinned (TORCH_SPEC) so that a CPU-only machine gets the CPU
# wheel instead of several GB of CUDA packages; override it on a GPU machine, e.g.
#   make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'

PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test check-install bench fuzz install clean docs-images report-docs

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/convexport optimize sample_models/seed004_full_padding.py -o out/seed004.opt.onnx --report out/seed004.report.json --html out/seed004.report.html
	@echo "HTML report: out/seed004.report.html"

# the suite on a worker per core (pytest-xdist; tests/conftest.py gives each worker's ONNX
# Runtime sessions one thread)
test: $(STAMP)
	$(VENV)/bin/ruff check convexport
	$(VENV)/bin/ruff format --check convexport
	$(VENV)/bin/mypy
	$(PY) -m pytest -n auto --dist worksteal

# the wheel built from this checkout, installed as README.md says into a fresh environment, run
# from a folder outside the checkout (CI runs it after `make test`)
check-install:
	TORCH_SPEC='$(TORCH_SPEC)' PYTHON=$(PYTHON) .ci/check-install

fuzz: $(STAMP)
	CONVEXPORT_FUZZ_EXAMPLES=10000 $(PY) -m pytest tests/test_random_graphs.py -k stay_exact -p no:cacheprovider

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/peers.py --write bench/RESULTS.md

# docs/report.png: the HTML report `make demo` writes, as a browser shows it (needs chromium)
docs-images: demo
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1500 \
		--screenshot=$(CURDIR)/docs/report.png file://$(CURDIR)/out/seed004.report.html

# docs/report.schema.json and docs/commands.md's report fields, from convexport/report/types.py
report-docs: $(STAMP)
	$(VENV)/bin/convexport report-schema > docs/report.schema.json
	$(PY) -c 'import pathlib, convexport.report.schema as s; p = pathlib.Path("docs/commands.md"); p.write_text(s.with_fields(p.read_text()))'

clean:
	rm -rf $(VENV) out .pytest_cache
