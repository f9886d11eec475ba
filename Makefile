# Trainyard: `make demo` and `make test` install what is missing, build, then run.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
# Tests run three at a time: most of their time is waiting (for processes to start, leases to
# lapse, a cut link to heal), so three keep two cores busy. Tests that share something one at a
# time say so (RESOURCE_LOCK: the hosts tests); more at once would not be faster, as those are
# the longest chain. CTEST_JOBS=1 runs them one by one.
CTEST_JOBS ?= 3
# The build's own progress lines are enough; no "Entering directory" for every sub-make.
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build test test-examples test-slow test-rest test-docs test-unit test-integration test-images test-trixie images demo bench clean \
	gpu-bundle gpu-rehearsal san-configure fuzz test-asan test-asan-trainer test-tsan test-tsan-trainer

all: build

deps:
	@bash scripts/install-deps.sh

configure:
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

# BUILD_TARGETS: only those (and what they need); everything by default.
BUILD_TARGETS ?=
build: configure
	@cmake --build $(BUILD_DIR) -j$(JOBS) $(if $(BUILD_TARGETS),--target $(BUILD_TARGETS))

test: deps build
	@cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j$(CTEST_JOBS) -LE 'examples|slow' $(CTEST_ARGS)

# Every example spec run as its header says, on a local cluster (about 2.5 minutes: CI runs it
# after `make test`, which leaves it out to stay within its 25 minutes).
test-examples: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L examples $(CTEST_ARGS)

# The tests that mostly wait for something slow to come (a Slurm allocation's time limit, about
# 3 minutes): CI runs them after `make test`, which leaves them out.
test-slow: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L slow $(CTEST_ARGS)

# What make test leaves out, the examples and the slow tests, at once (CI: about 3 minutes
# instead of 5.5 one after the other).
test-rest: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) -L 'examples|slow' $(CTEST_ARGS)

# The commands and specs of README.md and docs/*.md (about 30 s; part of `make test` too).
test-docs: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) -L docs $(CTEST_ARGS)

test-unit: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) -L unit $(CTEST_ARGS)

test-integration: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) -L integration $(CTEST_ARGS)

# The images of deploy/Dockerfile (podman; offline with a debootstrap base), then the containers
# test: a coordinator and three workers from the runtime image, a preemption by `podman stop`.
images:
	@bash scripts/build-images.sh

test-images: build images
	@bash tests/images/cluster_test.sh $(BUILD_DIR)

# The README's commands in a Debian 13 root (debootstrap, kept in /var/tmp/trainyard-trixie):
# `make test` there (TRIXIE_TARGET=demo for the demo; CTEST_ARGS and BUILD_TARGETS as for make
# test).
TRIXIE_TARGET ?= test
test-trixie:
	@BUILD_TARGETS="$(BUILD_TARGETS)" bash scripts/trixie-test.sh $(TRIXIE_TARGET) $(CTEST_ARGS)

# What a bare CUDA machine needs to build and check the trainer (.gpu/, scripts/gpu-check.sh
# there), and the check rehearsed without a GPU in a Debian 13 root that has none of our -dev
# packages (slow; not part of make test).
gpu-bundle: deps build
	@bash scripts/gpu-bundle.sh $(BUILD_DIR)

gpu-rehearsal: gpu-bundle
	@bash scripts/gpu-rehearsal.sh

# The sanitizer tree SAN_DIR: clang, AddressSanitizer (leaks included) and
# UndefinedBehaviorSanitizer (-fno-sanitize-recover: any undefined behaviour fails), built once
# for the fuzz targets and the tests under those sanitizers (docs/testing.md).
SAN_DIR ?= build-fuzz
san-configure:
	@cmake -S . -B $(SAN_DIR) -DCMAKE_CXX_COMPILER=clang++ -DTRAINYARD_FUZZ=ON \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" >/dev/null

# The fuzz targets (tests/fuzz/), each run FUZZ_SECONDS from its seeds and what earlier runs found
# (CI: FUZZ_SECONDS=10).
FUZZ_SECONDS ?= 60
fuzz: deps san-configure
	@cmake --build $(SAN_DIR) --target fuzzers -j$(JOBS)
	@bash scripts/fuzz.sh $(SAN_DIR) $(FUZZ_SECONDS)

# The unit tests of the coordinator, the agent, the CLI and the shared code, and s3_test (real
# s3rver processes), under those sanitizers. ASAN_TRAINER_TESTS adds the trainer's unit tests
# (LibTorch, not instrumented: only our code is checked; a longer build, not in CI).
ASAN_TESTS ?= common_test s3_test server_logic_test auth_test console_test rendezvous_test \
	job_manager_test recovery_test coordinator_server_test coordinator_metrics_test job_store_test \
	subprocess_test reconciler_test log_shipper_test preemption_test agent_test \
	local_address_test agent_metrics_test cli_args_test cli_format_test data_pack_test capacity_test
ASAN_TRAINER_TESTS ?= checkpoint_test communicator_test ps_partition_test ps_shard_test \
	pipeline_plan_test program_parts_test
test-asan: deps san-configure
	@cmake --build $(SAN_DIR) -j$(JOBS) --target $(ASAN_TESTS)
	@cd $(SAN_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) -E 'postgres' \
		-R '^($(shell echo $(ASAN_TESTS) | tr ' ' '|'))$$'
test-asan-trainer: deps san-configure
	@cmake --build $(SAN_DIR) -j$(JOBS) --target $(ASAN_TRAINER_TESTS)
	@cd $(SAN_DIR) && ctest --output-on-failure -j$(CTEST_JOBS) \
		-R '^($(shell echo $(ASAN_TRAINER_TESTS) | tr ' ' '|'))$$'

# The unit tests of the concurrent classes under ThreadSanitizer, in TSAN_DIR (gcc): the job
# manager (job_manager_test, recovery_test), the group committer, the standby copy and the lease
# keeper (job_store_test; postgres_store_test against a PostgreSQL the test starts), the agent's
# reconciler, log shipper and notice watchers (preemption_test), the capacity loop beside the job
# manager (capacity_test). Reports fail the test; tests/tsan/suppressions.txt lists what is
# suppressed, and why. Debian 12's Abseil is told of (tests/tsan/absl_sync_annotations.cc).
TSAN_DIR ?= build-tsan
TSAN_TESTS ?= tsan_annotations_check job_manager_test recovery_test job_store_test reconciler_test \
	log_shipper_test agent_test capacity_test preemption_test
test-tsan: deps
	@cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_TSAN=ON \
		-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" >/dev/null
	@cmake --build $(TSAN_DIR) -j$(JOBS) --target $(TSAN_TESTS)
	@cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan/suppressions.txt" \
		ctest --output-on-failure -j$(CTEST_JOBS) \
		-R '^($(shell echo $(TSAN_TESTS) | tr ' ' '|')|postgres_store_test|tsan_annotations_.*)$$'

# The Gloo communicator's pairs (communicator_test) under ThreadSanitizer: the trainer's library,
# a longer build, not in CI.
TSAN_TRAINER_TESTS ?= communicator_test
test-tsan-trainer: deps
	@cmake -S . -B $(TSAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINYARD_TSAN=ON \
		-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" >/dev/null
	@cmake --build $(TSAN_DIR) -j$(JOBS) --target $(TSAN_TRAINER_TESTS)
	@cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan/suppressions.txt" \
		ctest --output-on-failure -R '^($(shell echo $(TSAN_TRAINER_TESTS) | tr ' ' '|'))$$'

demo: deps build
	@bash scripts/demo.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
