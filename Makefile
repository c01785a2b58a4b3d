# Omni: the two commands of the quick start are `make demo` and `make test`.
# Each installs the Debian packages it needs (scripts/install_deps.sh, a no-op
# when they are present), configures with the CMake preset, builds (ccache,
# Ninja) and runs.
PRESET ?= dev
JOBS ?= $(shell nproc)
BUILD_DIR := build

.PHONY: all deps configure build demo test test-fast bench soak lint format clean

all: build

deps:
	@bash scripts/install_deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then cmake --preset $(PRESET); fi

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)

# Every C++ and Python test (unit, integration, package consumer).
test: build
	@ctest --preset $(PRESET) -j 2

# The fast set: everything not labelled slow.
test-fast: build
	@ctest --preset fast -j 2

bench: build
	@bash scripts/bench.sh $(BUILD_DIR)

# The elastic job's soak test (tests/soak/soak.py, docs/elastic.md "Soak"):
# 500 injected failures, about 25 minutes on 2 cores; one JSON line.
# SOAK_ARGS passes options, e.g. SOAK_ARGS="--failures 50".
SOAK_ARGS ?=
soak: configure
	@cmake --build --preset $(PRESET) -j $(JOBS) --target omni_train
	@/usr/bin/python3 tests/soak/soak.py --bin-dir $(BUILD_DIR)/bin --out $(BUILD_DIR)/soak $(SOAK_ARGS)

lint: configure
	@bash scripts/lint.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
