# nexus — see README.md. Every target works on a fresh Debian 12 machine
# with Go installed: `setup` fetches what is missing.

GO        ?= go
BIN       := bin/nexus
STATE_DIR ?= $(CURDIR)/.demo-state
export NEXUS_DRIVER ?= process

.PHONY: all setup build demo test bench soak fuzz clean

all: build

# Host tools the tests drive for real, and the Go modules.
setup:
	@missing=""; for t in mkfs.ext4 e2fsck resize2fs debugfs dumpe2fs; do \
	  command -v $$t >/dev/null 2>&1 || missing="$$missing e2fsprogs"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing e2fsprogs"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs; fi
	$(GO) mod download

build:
	$(GO) build -o $(BIN) ./cmd/nexus

# The main job on the embedded default journal, with the process driver.
demo: setup build
	@rm -rf $(STATE_DIR)
	$(BIN) --state-dir $(STATE_DIR) demo
	$(BIN) --state-dir $(STATE_DIR) events
	$(BIN) --state-dir $(STATE_DIR) ls

test: setup
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...

# The model-based crash harness with a long budget (the test suite runs a
# short one): random lifecycles, SIGKILL at random saga steps, invariants
# after every operation. NEXUS_MODEL_SEED=N replays one sequence.
soak: setup
	NEXUS_MODEL_RUNS=$${NEXUS_MODEL_RUNS:-40} NEXUS_MODEL_OPS=$${NEXUS_MODEL_OPS:-30} \
	  $(GO) test -run TestModelRandomLifecycles -count=1 -v -timeout 3h ./cmd/nexus/

# Every fuzz target for FUZZTIME each; their seed corpora are checked in
# under testdata/fuzz and also run by `make test`.
FUZZTIME ?= 30s
FUZZ_TARGETS := events:FuzzDecode layout:FuzzCoveredBy projections:FuzzUnmarshalState \
	host/intent:FuzzRead host/supervisor:FuzzParsePair host/imagecache:FuzzReadIdentity \
	lifecycle:FuzzArgumentsThatBecomePaths
fuzz: setup
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz $$pkg $$fn"; $(GO) test ./$$pkg/ -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) || exit 1; done

# Benchmarks report ratios against a baseline measured in the same run;
# see docs/benchmarks.md for what each measures and the figures.
bench: setup
	$(GO) test -run '^$$' -bench 'Append|RawWrite' -benchtime 2000x ./host/journal/
	$(GO) test -run '^$$' -bench 'Replay100k' -benchtime 5x -benchmem ./host/journal/
	$(GO) test -run '^$$' -bench 'Verify1M' -benchtime 1x -timeout 20m ./host/journal/
	$(GO) test -run '^$$' -bench 'Startup100k' -benchtime 3x ./node/
	$(GO) test -run TestOwnershipMemory100k -v ./projections/
	$(GO) test -run '^$$' -bench 'Clone' -benchtime 5x ./host/disk/
	$(GO) test -run '^$$' -bench 'CreateVsCpSparse' -benchtime 5x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'Lifecycle100|Fork16' -benchtime 1x -timeout 30m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'ReapScanClassify' -benchtime 1x -timeout 30m ./lifecycle/
	$(GO) test -run '^$$' -bench 'ReapApply10k' -benchtime 2x ./lifecycle/

clean:
	rm -rf bin $(STATE_DIR)
