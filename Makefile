# The everyday commands. `make help` lists them.
.PHONY: help run fmt lint deny test test-one bench fuzz fuzz-short image ci

FUZZ_TARGETS := review_decide review_member_order ownership_document trim_patch merge_patch
FUZZ_SECONDS ?= 600

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

run: ## the webhook on the embedded example rules (CA written to /tmp/statusguard-ca.pem)
	cargo run --release -- serve --write-ca /tmp/statusguard-ca.pem

fmt: ## format the code
	cargo fmt --all

lint: ## formatting check and clippy with warnings as errors
	cargo fmt --all -- --check
	cargo clippy --locked --all-targets -- -D warnings

deny: ## licenses, bans and sources of every dependency (cargo install cargo-deny)
	cargo deny check licenses bans sources

test: ## every test, against a real kube-apiserver and etcd (the README's command)
	./tests/run.sh

test-one: ## one test file, e.g. make test-one T=e2e_flush
	./tests/run.sh --test $(T)

bench: ## criterion, the load bench against the null webhook (needs h2load), and the end-to-end bench
	cargo bench --bench decision
	cargo bench --bench server_load
	LOAD_SWEEP=size cargo bench --bench server_load
	LOAD_SWEEP=rules cargo bench --bench server_load
	cargo bench --bench e2e_apiserver

fuzz: ## every fuzz target for FUZZ_SECONDS each (cargo install cargo-fuzz; nightly)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  (cd fuzz && cargo +nightly fuzz run $$t corpus/$$t seeds/$$t -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096) || exit 1; \
	done

fuzz-short: ## every fuzz target for 20 s, from the committed seeds (what CI runs)
	$(MAKE) fuzz FUZZ_SECONDS=20

image: ## the container image without a container engine, checked (IMAGE=REPO:TAG also pushes)
	image/build.sh

ci: ## what CI runs
	bash .ci/run
