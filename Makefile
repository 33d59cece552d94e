# nexus — see README.md. Every target works on a fresh Debian 12 machine
# with Go installed: `setup` fetches what is missing.

GO        ?= go
BIN       := bin/nexus
STATE_DIR ?= $(CURDIR)/.demo-state
export NEXUS_DRIVER ?= process

.PHONY: all setup build demo test bench clean

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

# Benchmarks report ratios against a baseline measured in the same run;
# see docs/benchmarks.md for what each measures and the figures.
bench: setup
	$(GO) test -run '^$$' -bench 'Append|RawWrite' -benchtime 2000x ./host/journal/
	$(GO) test -run '^$$' -bench 'Replay100k' -benchtime 5x -benchmem ./host/journal/
	$(GO) test -run '^$$' -bench 'Startup100k' -benchtime 3x ./node/
	$(GO) test -run TestOwnershipMemory100k -v ./projections/
	$(GO) test -run '^$$' -bench 'Clone' -benchtime 5x ./host/disk/
	$(GO) test -run '^$$' -bench 'ReapScanClassify' -benchtime 1x -timeout 30m ./lifecycle/
	$(GO) test -run '^$$' -bench 'ReapApply10k' -benchtime 2x ./lifecycle/

clean:
	rm -rf bin $(STATE_DIR)
