# Omni: the two commands of the quick start are `make demo` and `make test`.
# Each installs the Debian packages it needs (scripts/install_deps.sh, a no-op
# when they are present), configures with the CMake preset, builds (ccache,
# Ninja) and runs.
PRESET ?= dev
JOBS ?= $(shell nproc)
BUILD_DIR := build

.PHONY: all deps configure build demo test test-fast bench lint format clean

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

lint: configure
	@bash scripts/lint.sh $(BUILD_DIR)

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
