# nexus — see README.md. Every target works on a fresh Debian 12 machine
# with Go installed: `setup` fetches what is missing.

GO        ?= go
BIN       := bin/nexus
# nexusd, the daemon's binary (cmd/nexus built with -tags nexusd): the CLI
# finds it beside itself.
DAEMON    := bin/nexusd
# nexus-fleet runs the fleet-wide reads (cmd/nexus built with -tags
# nexusfleet: the CLI and the NATS client): the CLI execs it beside itself.
FLEET     := bin/nexus-fleet
# nexus-shim runs the sandboxes' supervisors and the process and qemu
# drivers' VMMs: a small binary, found beside nexus and nexusd.
SHIM      := bin/nexus-shim
AGENT     := bin/nexus-agent
STATE_DIR ?= $(CURDIR)/.demo-state
export NEXUS_DRIVER ?= process

.PHONY: all setup setup-fast setup-test build install install-files demo demo-guest test test-fast bench soak fuzz clean

all: build

# Host tools nexus drives for real (e2fsprogs), and the Go modules.
setup:
	@missing=""; for t in mkfs.ext4 e2fsck resize2fs debugfs dumpe2fs; do \
	  command -v $$t >/dev/null 2>&1 || missing="$$missing e2fsprogs"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing e2fsprogs"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs; fi
	$(GO) mod download

# What the unit tests need beyond setup: cpio, which reads back the guest
# initramfs nexus writes, and flock(1) (util-linux), another process
# holding a lease.
setup-fast: setup
	@missing=""; command -v cpio >/dev/null 2>&1 || missing="$$missing cpio"; \
	command -v flock >/dev/null 2>&1 || missing="$$missing util-linux"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

# What only the tests need: QEMU and a Debian cloud kernel (real guests
# boot in the suite), strace (the snapshot-durability test reads nexus's
# fsyncs from it), fuse3 unless root (the power-loss tests mount a FUSE
# filesystem; root mounts it without fusermount3), xfsprogs (reflink tests loop-mount an XFS made
# with reflink=1), man (the installed pages are read back), Node.js and the example subscriber's npm packages (a
# subscriber in another language runs in the suite).
setup-test: setup-fast
	@missing=""; command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$$missing qemu-system-x86"; \
	command -v strace >/dev/null 2>&1 || missing="$$missing strace"; \
	command -v fusermount3 >/dev/null 2>&1 || [ "$$(id -u)" = 0 ] || missing="$$missing fuse3"; \
	ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || missing="$$missing linux-image-cloud-amd64"; \
	command -v mkfs.xfs >/dev/null 2>&1 || [ -x /usr/sbin/mkfs.xfs ] || [ -x /sbin/mkfs.xfs ] || missing="$$missing xfsprogs"; \
	command -v man >/dev/null 2>&1 || missing="$$missing man-db"; \
	command -v systemd-analyze >/dev/null 2>&1 && command -v systemd-socket-activate >/dev/null 2>&1 || missing="$$missing systemd"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
	@if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  echo "installing nodejs"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; fi
	npm ci --prefix examples/subscriber-node --no-audit --no-fund --loglevel=error

# The CLI and nexus-fleet are built static (CGO_ENABLED=0): they need no
# C library, and loading one (the dynamic loader, libc, threads started through pthread)
# was a tenth of every command's start-up.
build:
	CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -buildvcs=auto" $(GO) build -o $(BIN) ./cmd/nexus
	GOFLAGS="$(GOFLAGS) -buildvcs=auto" $(GO) build -tags nexusd -o $(DAEMON) ./cmd/nexus
	CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -buildvcs=auto" $(GO) build -tags nexusfleet -o $(FLEET) ./cmd/nexus
	GOFLAGS="$(GOFLAGS) -buildvcs=auto" $(GO) build -o $(SHIM) ./cmd/nexus-shim
	CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) -buildvcs=auto" $(GO) build -o $(AGENT) ./cmd/nexus-agent

# Installs as a system's tools are: the binaries, a man page per command
# and the shell completions, under $(DESTDIR)$(PREFIX).
PREFIX ?= /usr/local
install: build install-files
install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/lib/systemd/system \
	  $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
	  $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 0755 $(BIN) $(DAEMON) $(FLEET) $(SHIM) $(AGENT) $(DESTDIR)$(PREFIX)/bin/
	$(BIN) docs man $(DESTDIR)$(PREFIX)/share/man/man1 >/dev/null
	$(BIN) completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/nexus
	$(BIN) completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_nexus
	$(BIN) completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/nexus.fish
	install -m 0644 dist/systemd/nexus.socket $(DESTDIR)$(PREFIX)/lib/systemd/system/
	sed 's#@BINDIR@#$(PREFIX)/bin#' dist/systemd/nexus.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/nexus.service

# The main job on the embedded default journal, for real with the process
# driver: a sandbox from a sparse image, a fork, a snapshot and its
# restore, a stop and start, an audit, then removal and a reap that must
# find nothing.
NX := $(BIN) --state-dir $(STATE_DIR)
DEMO_IMAGE := $(STATE_DIR).image.raw
demo: setup build
	@rm -rf $(STATE_DIR) $(DEMO_IMAGE)
	@truncate -s 256M $(DEMO_IMAGE) && head -c 8M /dev/urandom | dd of=$(DEMO_IMAGE) conv=notrunc status=none
	$(NX) create --image $(DEMO_IMAGE) --handle demo/one
	$(NX) fork demo/one --count 2
	$(NX) snapshot demo/one > $(STATE_DIR).snap
	$(NX) restore $$(cat $(STATE_DIR).snap)
	$(NX) snapshot ls demo/one
	$(NX) stop demo/one
	$(NX) start demo/one
	$(NX) ls
	$(NX) image-cache list
	$(NX) reap
	$(NX) replay verify
	$(NX) replay timeline demo/one
	@for id in $$($(NX) ls -q); do $(NX) rm -f --with-snapshots $$id; done
	$(NX) reap --apply
	$(NX) replay diff
	$(NX) ls
	@rm -f $(STATE_DIR).snap $(DEMO_IMAGE)

# NEXUS_REQUIRE_QEMU=1: a real-guest test fails, never skips, when QEMU
# or the kernel is missing. Every test bounds its own waits and fails with
# the process's log; -timeout is the last resort for a hang, set so that
# cmd/nexus's end-to-end tests still finish on a shared machine running
# 2-3x slower than a quiet one.
test: setup-test
	$(GO) vet ./...
	$(GO) vet -tags nexusd ./cmd/nexus
	$(GO) vet -tags nexusfleet ./cmd/nexus
	NEXUS_REQUIRE_QEMU=1 $(GO) test -race -count=1 -timeout 50m ./...

# The unit tests, for the edit-test loop (under a minute): every package
# but the end-to-end ones (cmd/nexus, client), under -short, which skips
# the fleet cluster, the scale tests and long crash-loop tests, and runs a
# sample of the tables that walk every saga step. `make test` runs everything.
FAST_PKGS = $(shell $(GO) list ./... | grep -v -e '/cmd/nexus$$' -e '/client$$')
test-fast: setup-fast
	$(GO) test -short -count=1 $(FAST_PKGS)

# The model-based crash harnesses with a long budget (the test suite runs
# short ones): random lifecycles, SIGKILL at random saga steps, and rounds
# of operations at once with SIGINT/SIGKILL of clients and the daemon;
# invariants after every operation; and power cuts under real commands on
# a FUSE root that drops what was not fsynced (NEXUS_POWERCUT_CUTS).
# NEXUS_MODEL_SEED=N replays one sequence, NEXUS_POWERCUT_SEED=N one run of cuts.
soak: setup
	NEXUS_MODEL_RUNS=$${NEXUS_MODEL_RUNS:-40} NEXUS_MODEL_OPS=$${NEXUS_MODEL_OPS:-30} \
	NEXUS_MODEL_CONC_RUNS=$${NEXUS_MODEL_CONC_RUNS:-30} NEXUS_MODEL_ROUNDS=$${NEXUS_MODEL_ROUNDS:-12} \
	NEXUS_POWERCUT_CUTS=$${NEXUS_POWERCUT_CUTS:-60} \
	  $(GO) test -run 'TestModelRandomLifecycles|TestModelConcurrentLifecycles|TestPowerCut$$' -count=1 -v -timeout 3h ./cmd/nexus/

# Every fuzz target for FUZZTIME each; their seed corpora are checked in
# under testdata/fuzz and also run by `make test`.
FUZZTIME ?= 30s
FUZZ_TARGETS := events:FuzzDecode events:FuzzCheckBounds layout:FuzzCoveredBy projections:FuzzUnmarshalState \
	host/intent:FuzzRead host/supervisor:FuzzParsePair host/imagecache:FuzzReadIdentity \
	lifecycle:FuzzArgumentsThatBecomePaths ledger:FuzzParseRecord ledger:FuzzParseNames agentproto:FuzzDecode
fuzz: setup
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz $$pkg $$fn"; $(GO) test ./$$pkg/ -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) || exit 1; done

# Benchmarks report ratios against a baseline measured in the same run;
# see docs/benchmarks.md for what each measures and the figures. The last
# line is issue 21's scale table (GNU time reports each command's max RSS;
# NEXUS_BENCH_LARGE=0 leaves out 100k sandboxes and 1M events).
bench: setup
	@[ -x /usr/bin/time ] || { echo "installing time"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time; }
	$(GO) test -run '^$$' -bench 'Append|RawWrite' -benchtime 2000x ./host/journal/
	$(GO) test -run '^$$' -bench 'Replay100k' -benchtime 5x -benchmem ./host/journal/
	$(GO) test -run '^$$' -bench 'EventsByPosition' -benchtime 3x ./host/journal/
	$(GO) test -run '^$$' -bench 'Verify1M' -benchtime 1x -timeout 20m ./host/journal/
	$(GO) test -run '^$$' -bench 'Startup100k' -benchtime 3x ./store/
	$(GO) test -run '^$$' -bench 'AppendGuardedVsPlain' -benchtime 3000x ./store/
	$(GO) test -run '^$$' -bench 'AppendGroupCommit' -benchtime 2000x ./daemon/
	$(GO) test -run '^$$' -bench 'AppendingCommand10k' -benchtime 10x ./store/
	$(GO) test -run '^$$' -bench 'OpenInspect' -benchtime 5x -timeout 20m ./store/
	$(GO) test -run '^$$' -bench 'OpenGrowth' -benchtime 3x -timeout 30m ./store/
	$(GO) test -run TestOwnershipMemory100k -v ./projections/
	$(GO) test -run '^$$' -bench 'Clone' -benchtime 5x ./host/disk/
	$(GO) test -run '^$$' -bench 'CreateVsCpSparse' -benchtime 5x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'CreateMissHitVsCp' -benchtime 5x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'CreateHitVsReflink|SpawnToReady' -benchtime 10x -timeout 25m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'Lifecycle100|Fork16' -benchtime 1x -timeout 30m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'ReapScanClassify' -benchtime 1x -timeout 30m ./lifecycle/
	$(GO) test -run '^$$' -bench 'ReapApply10k' -benchtime 2x ./control/local/
	$(GO) test -run '^$$' -bench 'SweepHappyPath|SweepDead' -benchtime 1x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'ConcurrentCreatesAutoVsHand' -benchtime 5x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'QEMUBootVsHand' -benchtime 3x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'AgentExec/process' -benchtime 50x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'AgentCp/process' -benchtime 3x ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'Copy' -benchtime 5x ./guest/agent/
	$(GO) test -run '^$$' -bench 'Agent(Exec|Cp)/qemu' -benchtime 3x -timeout 30m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'ScaleTable|ScaleCreates8' -benchtime 1x -timeout 60m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'RecoverStopped' -benchtime 20x ./control/local/
	$(GO) test -run '^$$' -bench 'ScaleOnDemand' -benchtime 1x -timeout 60m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'CLIStartCPU' -benchtime 80x -timeout 20m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'GetVsCLI' -benchtime 60x -timeout 15m ./client/
	$(GO) test -run '^$$' -bench 'AppendVsJetStream' -benchtime 3000x -count 3 ./daemon/
	$(GO) test -run '^$$' -bench 'AppendingCLI8' -benchtime 8x -timeout 30m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'OverlayCreate' -benchtime 9x -v -timeout 40m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'FleetLine' -benchtime 200000x -count 4 -timeout 10m ./cmd/nexus/
	$(GO) test -run '^$$' -bench 'FleetAggregateAfterOutage' -benchtime 1x -timeout 20m ./host/fleet/
	$(GO) test -v -run '^$$' -bench 'FleetEventsVsOrderedConsumer' -benchtime 5x -timeout 30m ./host/fleet/

clean:
	rm -rf bin $(STATE_DIR) $(DEMO_IMAGE) $(STATE_DIR).snap

# The same story on a real Linux guest: QEMU (KVM when /dev/kvm answers,
# else software emulation, a minute or two) boots the Debian cloud kernel
# with nexus-agent as init, over an overlay on a small busybox image; exec
# and cp run in the guest. It installs what it needs.
GUEST_DIR := $(STATE_DIR).guest
NXQ := $(NX) --driver qemu
demo-guest: export NEXUS_KERNEL_PATH := $(GUEST_DIR)/vmlinuz
demo-guest: export NEXUS_INITRAMFS_PATH := $(GUEST_DIR)/initrd.gz
demo-guest: setup build
	@missing=""; command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$$missing qemu-system-x86"; \
	[ -x /bin/busybox ] || missing="$$missing busybox-static"; \
	ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || missing="$$missing linux-image-cloud-amd64"; \
	if [ -n "$$missing" ]; then echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
	@rm -rf $(STATE_DIR) $(GUEST_DIR) && mkdir -p $(GUEST_DIR)/root/bin $(GUEST_DIR)/root/etc $(GUEST_DIR)/root/root $(GUEST_DIR)/root/tmp
	@cp /bin/busybox $(GUEST_DIR)/root/bin/ && for a in sh cat ls uname; do ln -s busybox $(GUEST_DIR)/root/bin/$$a; done
	@echo "a busybox guest made by make demo-guest" > $(GUEST_DIR)/root/etc/motd
	@mkfs.ext4 -q -F -d $(GUEST_DIR)/root $(GUEST_DIR)/os.ext4 64M
	@release=$$(ls /boot/vmlinuz-*-cloud-amd64 | sort -V | tail -1 | sed 's#/boot/vmlinuz-##'); \
	cp /boot/vmlinuz-$$release $(GUEST_DIR)/vmlinuz && \
	$(BIN) guest initramfs --kernel-release $$release -o $(GUEST_DIR)/initrd.gz
	$(NXQ) create --image $(GUEST_DIR)/os.ext4 --handle guest/one --memory 512M
	$(NXQ) exec guest/one -- uname -sr
	$(NXQ) exec guest/one -- sh -c 'cat /etc/motd; echo written in the guest > /root/note'
	$(NXQ) cp guest/one:/root/note $(GUEST_DIR)/note && cat $(GUEST_DIR)/note
	$(NXQ) snapshot guest/one
	$(NXQ) stop guest/one
	$(NXQ) start guest/one
	$(NXQ) exec guest/one -- cat /root/note
	$(NXQ) ls
	$(NXQ) rm -f --with-snapshots guest/one
	$(NXQ) reap --apply
	$(NXQ) replay diff
