# Trainyard: `make demo` and `make test` install what is missing, build, then run.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
# The build's own progress lines are enough; no "Entering directory" for every sub-make.
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build test test-examples test-docs test-unit test-integration test-images test-trixie images demo bench clean \
	gpu-bundle gpu-rehearsal fuzz test-asan

all: build

deps:
	@bash scripts/install-deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j$(JOBS)

test: deps build
	@cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -LE examples $(CTEST_ARGS)

# Every example spec run as its header says, on a local cluster (about 1.5 minutes: CI runs it
# after `make test`, which leaves it out to stay within its 25 minutes).
test-examples: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L examples $(CTEST_ARGS)

# The commands and specs of README.md and docs/*.md (about 30 s; part of `make test` too).
test-docs: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L docs $(CTEST_ARGS)

test-unit: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L unit $(CTEST_ARGS)

test-integration: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L integration $(CTEST_ARGS)

# The images of deploy/Dockerfile (podman; offline with a debootstrap base), then the containers
# test: a coordinator and three workers from the runtime image, a preemption by `podman stop`.
images:
	@bash scripts/build-images.sh

test-images: build images
	@bash tests/images/cluster_test.sh $(BUILD_DIR)

# The README's commands in a Debian 13 root (debootstrap, kept in /var/tmp/trainyard-trixie):
# `make test` there (TRIXIE_TARGET=demo for the demo; CTEST_ARGS as for make test).
TRIXIE_TARGET ?= test
test-trixie:
	@bash scripts/trixie-test.sh $(TRIXIE_TARGET) $(CTEST_ARGS)

# What a bare CUDA machine needs to build and check the trainer (.gpu/, scripts/gpu-check.sh
# there), and the check rehearsed without a GPU in a Debian 13 root that has none of our -dev
# packages (slow; not part of make test).
gpu-bundle: deps build
	@bash scripts/gpu-bundle.sh $(BUILD_DIR)

gpu-rehearsal: gpu-bundle
	@bash scripts/gpu-rehearsal.sh

# The fuzz targets (tests/fuzz/, docs/testing.md): built with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer in FUZZ_DIR, each run FUZZ_SECONDS from its seeds and what earlier
# runs found (CI: 20 s each).
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz: deps
	@cmake -S . -B $(FUZZ_DIR) -DCMAKE_CXX_COMPILER=clang++ -DTRAINYARD_FUZZ=ON \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(FUZZ_DIR) --target fuzzers -j$(JOBS)
	@bash scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# The unit tests of the coordinator's and the shared code's classes under AddressSanitizer (leaks
# included) and UndefinedBehaviorSanitizer, in ASAN_DIR (docs/testing.md, "Sanitizers").
ASAN_DIR ?= build-asan
ASAN_TESTS ?= common_test server_logic_test auth_test console_test rendezvous_test \
	job_manager_test recovery_test coordinator_server_test coordinator_metrics_test job_store_test
test-asan: deps
	@cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
		-DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
		>/dev/null
	@cmake --build $(ASAN_DIR) -j$(JOBS) --target $(ASAN_TESTS)
	@cd $(ASAN_DIR) && ctest --output-on-failure -E 'postgres' \
		-R '^($(shell echo $(ASAN_TESTS) | tr ' ' '|'))$$'

demo: deps build
	@bash scripts/demo.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
