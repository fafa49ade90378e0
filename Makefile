# embps: thin wrapper over CMake. `make demo` and `make test` each install
# missing Debian packages, configure and build first.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2

.PHONY: all deps build demo test test-sanitize test-tsan bench compare install container-test clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900

# The unit, integration and fuzz-replay suites under AddressSanitizer +
# UndefinedBehaviorSanitizer (CI runs it after `make test`). Both sanitizer
# runs take two tests at a time (SAN_JOBS): their tests mostly wait for
# servers, elections and leases (a third of their wall time is CPU), and
# their deadlines are generous; `make test` runs one at a time, for the
# benches and the figures it reports.
SAN_JOBS ?= 2
SAN_BUILD ?= build-asan
test-sanitize: deps
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DEMBPS_SANITIZE=address,undefined
	cmake --build $(SAN_BUILD) -j$(JOBS)
	cd $(SAN_BUILD) && ctest -j$(SAN_JOBS) --output-on-failure --timeout 900 \
	  -L '^(unit|integration|fuzz)$$'

# The same suites (all of them exercise threads) under ThreadSanitizer, but
# unit.memory (one thread measuring memory, which TSan's shadow inflates) and
# durability.corrupt (about a hundred server starts on damaged copies of a
# data dir, each a restore that refuses or truncates before any thread
# serves: four minutes under TSan for no thread the other suites do not
# run; ASan + UBSan run it).
# Built with clang and LLVM's OpenMP runtime with its Archer tool, so TSan
# sees the parallel apply run on two OpenMP threads (tests/CMakeLists.txt).
TSAN_BUILD ?= build-tsan
TSAN_CC ?= clang
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DCMAKE_C_COMPILER=$(TSAN_CC) -DEMBPS_SANITIZE=thread
	cmake --build $(TSAN_BUILD) -j$(JOBS)
	cd $(TSAN_BUILD) && ctest -j$(SAN_JOBS) --output-on-failure --timeout 900 \
	  -L '^(unit|integration|fuzz)$$' \
	  -E '^(unit\.memory|durability\.corrupt)$$'

bench: build
	bash tests/bench/compare $(BUILD)

install: build
	cmake --install $(BUILD)

# podman image, two servers, the example workers, kube play (root, slow)
container-test: build
	bash tests/container/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
