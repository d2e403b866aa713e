//! The pure decision, and the whole request path without HTTP (parse,
//! decide, encode), on a 16 KiB Widget with 4 writers.
//!
//!     cargo bench --bench decision

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use statusguard::decision::{Endpoint, decide};
use statusguard::ownership::Ownership;
use statusguard::review::{encode_response, parse_request};
use std::hint::black_box;

fn benches(c: &mut Criterion) {
    let rules = Ownership::from_yaml(&common::ownership()).expect("the benchmark rules are valid");
    let stale = serde_json::to_vec(&common::review(true)).expect("serializable");
    let own = serde_json::to_vec(&common::review(false)).expect("serializable");
    eprintln!(
        "review size: {} bytes (two objects of about {} KiB)",
        stale.len(),
        stale.len() / 2048
    );
    let stale_request = parse_request(&stale).expect("a valid review");
    let own_request = parse_request(&own).expect("a valid review");

    let mut group = c.benchmark_group("decide");
    group.bench_function("validate, own change (allowed)", |b| {
        b.iter(|| decide(&rules, black_box(&own_request), Endpoint::Validate))
    });
    group.bench_function("validate, stale write (denied)", |b| {
        b.iter(|| decide(&rules, black_box(&stale_request), Endpoint::Validate))
    });
    group.bench_function("mutate, stale write (trimmed)", |b| {
        b.iter(|| decide(&rules, black_box(&stale_request), Endpoint::Mutate))
    });
    group.finish();

    let mut group = c.benchmark_group("parse+decide+encode");
    group.throughput(criterion::Throughput::Bytes(stale.len() as u64));
    group.bench_function("mutate, stale write (trimmed)", |b| {
        b.iter(|| {
            let request = parse_request(black_box(&stale)).expect("valid");
            let mut decision = decide(&rules, &request, Endpoint::Mutate).expect("decided");
            encode_response(&mut decision.response).expect("encoded")
        })
    });
    group.finish();
}

criterion_group!(decision, benches);
criterion_main!(decision);
