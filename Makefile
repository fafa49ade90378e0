# embps: thin wrapper over CMake. `make demo` and `make test` each install
# missing Debian packages, configure and build first.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= 2

.PHONY: all deps build demo test bench compare install container-test clean

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

bench: build
	bash tests/bench/compare $(BUILD)

install: build
	cmake --install $(BUILD)

# podman image, two servers, the example workers, kube play (root, slow)
container-test: build
	bash tests/container/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
