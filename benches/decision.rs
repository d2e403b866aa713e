//! The pure decision, and the whole request path without HTTP (read,
//! decide, encode; in one pass and in two), on a 16 KiB Widget with 4 writers.
//!
//!     cargo bench --bench decision

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use statusguard::decision::{Endpoint, decide, read_and_decide};
use statusguard::ownership::Ownership;
use statusguard::review::{encode_response, parse_request};
use std::hint::black_box;

fn benches(c: &mut Criterion) {
    let rules = Ownership::from_yaml(&common::ownership()).expect("the benchmark rules are valid");
    let stale = common::review(true);
    let own = common::review(false);
    eprintln!(
        "review size: {} bytes (two objects of about {} KiB)",
        stale.len(),
        stale.len() / 2048
    );
    let stale_request = parse_request(&stale).expect("a valid review");
    let own_request = parse_request(&own).expect("a valid review");

    // The floor of any serde_json-based parse: one scan of the body that
    // builds nothing. `parse` is the narrow review parse on top of it.
    let mut group = c.benchmark_group("read");
    group.throughput(criterion::Throughput::Bytes(stale.len() as u64));
    group.bench_function("scan only (serde_json, IgnoredAny)", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&stale)).expect("valid"))
    });
    group.bench_function("parse (narrow review)", |b| {
        b.iter(|| parse_request(black_box(&stale)).expect("valid").uid.len())
    });
    group.finish();

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
    group.bench_function("validate, stale write (denied)", |b| {
        b.iter(|| {
            let (_, decided) = read_and_decide(&rules, black_box(&stale), Endpoint::Validate).expect("valid");
            encode_response(&mut decided.expect("decided").response).expect("encoded")
        })
    });
    group.bench_function("mutate, stale write (trimmed)", |b| {
        b.iter(|| {
            let (_, decided) = read_and_decide(&rules, black_box(&stale), Endpoint::Mutate).expect("valid");
            encode_response(&mut decided.expect("decided").response).expect("encoded")
        })
    });
    group.bench_function("mutate, stale write (trimmed), two passes", |b| {
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
