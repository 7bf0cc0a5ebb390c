# syncmgr build, test and demo targets. `make demo` and `make test` do all
# their own set-up (Go modules, the daemon binary, a Python venv in .venv/).

GO      ?= go
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
BIN     := bin/syncmgr
GOFILES := $(shell find . -name '*.go' -not -path './.venv/*' 2>/dev/null)

.PHONY: all build venv test test-go test-py test-py-socket test-outside test-wheel wheel wheel-all lint lint-py fuzz demo demo-compare bench bench-main bench-smoke bench-targets bench-targets-smoke bench-scale bench-scale-smoke bench-queue-kills bench-cluster bench-cluster-smoke bench-socket bench-socket-smoke bench-aio bench-aio-smoke demo-shards soak soak-smoke clean

all: build

build: $(BIN)

$(BIN): $(GOFILES) go.mod go.sum
	$(GO) build -trimpath -o $(BIN) ./cmd/syncmgr

venv: $(VENV)/.installed

$(VENV)/.installed: pyclient/pyproject.toml pyclient/setup.py pyclient/_daemon_build.py $(wildcard pyclient/csrc/*) scripts/setup-venv.sh
	PYTHON=$(PYTHON) bash scripts/setup-venv.sh $(VENV)
	touch $@

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags synctest ./...

# -tags synctest builds the test hooks (statemem's ring kill steps) that
# production builds leave out, and the tests that use them.
test-go: build lint venv
	$(GO) test -race -count=1 -tags synctest ./...

# Each fuzz target runs a bounded number of inputs (a count, not a duration:
# a time budget can end while a worker is minimising, which go test reports as
# a failure on a loaded machine). Longer runs: make fuzz FUZZN=5000000.
# FuzzQueueBatch builds a manager and its ring for every input (a few ms
# each), so it runs a smaller share.
FUZZN ?= 500000
fuzz:
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZN)x
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzDecodeRequestMatchesMsgpack$$' -fuzztime $(FUZZN)x
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZN)x
	$(GO) test ./auth -run '^$$' -fuzz '^FuzzServerHandshake$$' -fuzztime $$(( $(FUZZN) / 10 ))x
	$(GO) test ./proxy -run '^$$' -fuzz '^FuzzDecodeValue$$' -fuzztime $$(( $(FUZZN) / 10 ))x
	$(GO) test ./manager -run '^$$' -fuzz '^FuzzQueueBatch$$' -fuzztime $$(( $(FUZZN) / 125 ))x
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzBinTuples$$' -fuzztime $$(( $(FUZZN) / 10 ))x
	$(GO) test ./statemem -run '^$$' -fuzz '^FuzzRingBatchScribbled$$' -fuzztime $$(( $(FUZZN) / 5 ))x

lint-py: venv
	$(VENV)/bin/ruff check pyclient tests/python tests/outside tests/wheel examples bench

test-py: build venv lint-py
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q tests/python

# The same suite with the fast path off: the socket path every TCP, remote or
# compiler-less client uses (the fast-path tests themselves skip).
test-py-socket: build venv
	SYNCMGR_FASTPATH=0 SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) -m pytest -q tests/python

# The load test: many client processes, random SIGKILLs, invariants checked.
soak: build
	$(GO) run ./tests/soak -bin $(BIN) -clients 64 -ops 3000 -kill-every 100ms

soak-smoke: build
	$(GO) run ./tests/soak -bin $(BIN) -clients 16 -ops 400 -kill-every 50ms -max-time 120s

# The Python wheels (needs Go, the CPythons 3.9-3.13 and PyPI): one per
# CPython and architecture, each with the fast-path extension and the static
# daemon, dist/syncmgr-<version>-cpXY-cpXY-manylinux_2_17_<arch>.manylinux2014_<arch>.whl
# for x86_64 and aarch64 (scripts/build-wheels.sh: Zig's C compiler for glibc
# 2.17, checked by auditwheel). wheel-all is the same target, kept as a name.
wheel:
	GO=$(GO) PYTHON=$(PYTHON) bash scripts/build-wheels.sh dist
	@ls -l dist/syncmgr-*.whl

wheel-all: wheel

# Builds every wheel into dist/ and checks each: auditwheel's tag, the
# extension's and the daemon's architecture; every x86_64 wheel installed in
# a fresh venv of its CPython with no Go and no C compiler on PATH and
# smoke-tested with the fast path on; the aarch64 wheels under qemu-user
# where Debian ships their CPython for arm64; the cp39 wheel under glibc
# 2.31. A missing CPython 3.9-3.13 fails (tests/wheel/smoke.sh).
test-wheel:
	GO=$(GO) PYTHON=$(PYTHON) bash tests/wheel/smoke.sh

# Test suites written outside this project (CPython's manager tests, cpprb's
# multiprocessing tests) with syncmgr as the manager, beside the stock manager;
# one line of counts per suite and start method (tests/outside/run_outside.py).
test-outside: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) tests/outside/run_outside.py $(OUTSIDE_ARGS)

test: test-go fuzz soak-smoke bench-smoke bench-targets-smoke bench-scale-smoke bench-cluster-smoke bench-socket-smoke bench-aio-smoke test-wheel test-py test-py-socket test-outside

# The Ape-X DQN on Ray + cpprb + syncmgr: exits 0 only if the greedy policy met
# CartPole-v1's own threshold (mean return >= 475 over 20 episodes, at 3
# evaluations in a row) and the run left nothing behind; prints `summary: PATH`.
# Flags: DEMO_ARGS="--seed 3", DEMO_ARGS="--env LunarLander-v3" (needs
# `$(PY) -m pip install 'gymnasium[box2d]'`).
demo: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) examples/ray_replay_demo.py $(DEMO_ARGS)

# Every setup (syncmgr, SyncManager, plain multiprocessing, one process) on the
# same 5 seeds, interleaved: the table and an overlay plot. WRITE_DOCS=1 also
# rewrites the demo's section of docs/benchmarks.md.
demo-compare: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) examples/ray_replay_demo.py --compare $(if $(WRITE_DOCS),--write-docs) $(DEMO_ARGS)

$(VENV)/.bench-installed: $(VENV)/.installed
	SYNCMGR_TEST_HOOKS=1 $(PY) -m pip install -q -e "./pyclient[bench]"
	touch $@

# The full benchmark: prints the tables and rewrites docs/benchmarks.md,
# every section (the main comparison, the targets and the Queue rows, the
# scale section, the Queue kill loops). Each part is a target of its own below.
bench: bench-main bench-targets bench-scale bench-queue-kills bench-cluster bench-socket bench-aio

bench-main: build venv $(VENV)/.bench-installed
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) -m bench $(BENCH_ARGS)

# N client processes (1, 8, 32, 64; 256 with >= 16 CPUs), spawn and fork:
# Locks, a Semaphore(4), Event.is_set and ping-pong against multiprocessing
# and the socket path; rewrites its own section of docs/benchmarks.md. Needs
# the built extension and the daemon only. SCALE_ARGS="--n 16,64,256".
bench-scale: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/scale.py $(SCALE_ARGS)
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/fork_child.py

# N=1 and 4, a tenth of a second per cell: checks that it runs (not its numbers).
bench-scale-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/scale.py --smoke
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/fork_child.py --smoke

# >= 1000 SIGKILLs at every labelled step of a Queue op on the ring, counted
# (duplicates, lost items, uncommitted puts seen, wedges); exits non-zero on
# any violation and rewrites its section of docs/benchmarks.md.
bench-queue-kills: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/queue_kills.py $(KILLS_ARGS)

# syncmgr.ray on simulated Ray nodes (ray.cluster_utils): start()/shutdown() on
# 3 nodes, co-located learners on 2 (against RLlib's replay-actor pattern and
# plain multiprocessing), remote ingestion over TCP+TLS; rewrites its section
# of docs/benchmarks.md. The smoke checks that it runs (not its numbers).
bench-cluster: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/cluster.py $(CLUSTER_ARGS)

bench-cluster-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/cluster.py --smoke

# The socket path (fast path off) against SyncManager and Redis: one client's
# round trip on Unix, TCP and TCP+TLS loopback, 16 and 64 clients' calls/s and the
# server's CPU per call, batches, and making a fast-path object. Redis columns
# need redis-server (apt-get install redis-server) and redis-py (the bench extra).
bench-socket: build venv $(VENV)/.bench-installed
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/socket_path.py

bench-socket-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/socket_path.py --smoke

# syncmgr.aio: a coroutine hand-off through a Queue against ray.util.queue,
# aioprocessing and the blocking fast path; async with lock; one set() waking
# 1,000 coroutines.
bench-aio: build venv $(VENV)/.bench-installed
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/aio_bench.py

bench-aio-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/aio_bench.py --smoke

# RLlib's co-located learner shards on syncmgr.ray, on 2 simulated nodes: each
# shard's DQN must reach a greedy mean return of 195 on CartPole-v1
# (SHARDS_ARGS="--address auto" on a real cluster; --target, --budget).
# WRITE_DOCS=1 writes its figures into docs/benchmarks.md.
demo-shards: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) examples/colocated_shards.py --local-nodes 2 $(if $(WRITE_DOCS),--write-docs) $(SHARDS_ARGS)

# A few seconds of every benchmark, to check that it runs (not its numbers).
bench-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) -m bench --smoke --no-redis

# The fast path's targets (Lock, Semaphore, Event and Value ops, hand-off,
# killed holder, cpprb table) and the Queue's (items/s against faster-fifo,
# multiprocessing.Queue, SyncManager and the socket path), each in one
# interleaved run; each rewrites its own section of docs/benchmarks.md.
# faster-fifo is optional (its rows are skipped without it).
bench-targets: build venv $(VENV)/.bench-installed
	-$(PY) -m pip install -q faster-fifo
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/targets.py $(TARGETS_ARGS)
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/queue_targets.py

# A fraction of a second per workload, to check that it runs (not its numbers).
bench-targets-smoke: build venv
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/targets.py --smoke
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/queue_targets.py --smoke
	SYNCMGR_BIN=$(CURDIR)/$(BIN) $(PY) bench/queue_kills.py --smoke

clean:
	rm -rf bin $(VENV) dist pyclient/build
