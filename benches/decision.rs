//! The pure decision, and the whole request path without HTTP (read,
//! decide, encode; in one pass and in two), on a 16 KiB Widget with 4 writers
//! (also with its large `endpoints` list owned),
//! on a Gateway API route of 32 parents of 8 conditions each, and on a
//! review with 10,000 condition items of one type, reordered.
//!
//!     cargo bench --bench decision

mod common;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use statusguard::admission::answer::{answer, decide_request, read_and_decide};
use statusguard::admission::decide::{Endpoint, Outcome};
use statusguard::admission::wire::{encode_response, parse_request};
use statusguard::ownership::Ownership;
use std::hint::black_box;

/// The allocator the statusguard binary runs on: a decision allocates, and
/// glibc's malloc costs it more than the server pays.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    // The single pass checks the body as UTF-8 once, with simdutf8.
    group.bench_function("utf-8 check (std)", |b| {
        b.iter(|| std::str::from_utf8(black_box(&stale)).is_ok())
    });
    group.bench_function("utf-8 check (simdutf8)", |b| {
        b.iter(|| simdutf8::basic::from_utf8(black_box(&stale)).is_ok())
    });
    group.finish();

    let mut group = c.benchmark_group("decide");
    group.bench_function("validate, own change (allowed)", |b| {
        b.iter(|| decide_request(&rules, black_box(&own_request), Endpoint::Validate))
    });
    group.bench_function("validate, stale write (denied)", |b| {
        b.iter(|| decide_request(&rules, black_box(&stale_request), Endpoint::Validate))
    });
    group.bench_function("mutate, stale write (trimmed)", |b| {
        b.iter(|| decide_request(&rules, black_box(&stale_request), Endpoint::Mutate))
    });
    group.finish();

    let mut group = c.benchmark_group("parse+decide+encode");
    group.throughput(criterion::Throughput::Bytes(stale.len() as u64));
    group.bench_function("validate, own change (allowed)", |b| {
        b.iter(|| {
            let (_, decided) = read_and_decide(&rules, black_box(&own), Endpoint::Validate).expect("valid");
            encode_response(&mut decided.expect("decided").response).expect("encoded")
        })
    });
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
            let mut decision = decide_request(&rules, &request, Endpoint::Mutate).expect("decided");
            encode_response(&mut decision.response).expect("encoded")
        })
    });
    group.finish();

    // Issue 25: the same stale write, its 120 `endpoints` owned by a fourth
    // writer (alice) and unchanged by the write; the whole path of `answer`,
    // as `LOAD_SWEEP=owned` drives it through the server.
    let owned = common::ownership_endpoints_owned();
    let owned_enforce =
        Ownership::from_yaml(&owned.replace("mode: trim", "mode: enforce")).expect("the benchmark rules are valid");
    let owned_trim = Ownership::from_yaml(&owned).expect("the benchmark rules are valid");
    let mut group = c.benchmark_group("endpoints owned");
    group.throughput(criterion::Throughput::Bytes(stale.len() as u64));
    bench_answer(
        &mut group,
        "validate, stale write (denied)",
        &owned_enforce,
        &stale,
        Endpoint::Validate,
    );
    bench_answer(
        &mut group,
        "mutate, stale write (trimmed)",
        &owned_trim,
        &stale,
        Endpoint::Mutate,
    );
    // The largest review of `LOAD_SWEEP=owned-size`: its owned endpoints,
    // about 820 KB of the 844 KB, unchanged and taken by their text.
    let large = common::review_shaped(true, common::Shape::sized(1 << 20));
    group.throughput(criterion::Throughput::Bytes(large.len() as u64));
    bench_answer(
        &mut group,
        "validate, stale write (denied), 844 KB",
        &owned_enforce,
        &large,
        Endpoint::Validate,
    );
    // The smallest review of `LOAD_SWEEP=owned-size` (3 KB, two conditions,
    // no endpoints): what a denial costs besides reading.
    let small = common::review_shaped(true, common::Shape::sized(3 << 10));
    group.throughput(criterion::Throughput::Bytes(small.len() as u64));
    bench_answer(
        &mut group,
        "validate, stale write (denied), 3 KB",
        &owned_enforce,
        &small,
        Endpoint::Validate,
    );
    group.finish();

    // Issue 25: where the fixture's denial goes. The same stale write with
    // a part of its status left out or left unchanged, so that each part's
    // cost is the difference from the whole (the shared rules, /validate).
    let shape = common::Shape::DEFAULT;
    let (old, new) = (common::status(2, 3, shape), common::status(1, 5, shape));
    let mut conditions_unchanged = new.clone();
    conditions_unchanged["conditions"] = old["conditions"].clone();
    let parts = [
        ("denied, the whole review", stale.clone()),
        (
            "denied, no conditions",
            common::review_shaped(true, common::Shape { conditions: 0, ..shape }),
        ),
        (
            "denied, no endpoints",
            common::review_shaped(true, common::Shape { endpoints: 0, ..shape }),
        ),
        (
            "denied, conditions unchanged",
            common::review_of(old.clone(), conditions_unchanged, shape),
        ),
        ("allowed, objects the same", common::review_of(old.clone(), old, shape)),
    ];
    let mut group = c.benchmark_group("fixture in parts");
    for (name, body) in &parts {
        bench_answer(&mut group, name, &rules, body, Endpoint::Validate);
    }
    group.finish();

    // Issue 24: a Gateway API HTTPRoute of 32 parents (16 per
    // implementation) of 8 conditions each, under examples/gateway-api.yaml;
    // the whole path of `answer`, body to encoded review.
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let read = |name: &str| std::fs::read(examples.join(name)).expect("the example is there");
    let document = String::from_utf8(read("gateway-api.yaml")).expect("UTF-8");
    let enforce = Ownership::from_yaml(&document).expect("the example is valid");
    let trim = Ownership::from_yaml(&document.replace("mode: enforce", "mode: trim")).expect("valid");
    let (route_own, route_stale) = (
        read("gateway-route-review.json"),
        read("gateway-route-stale-review.json"),
    );
    let mut group = c.benchmark_group("route, 32 parents x 8 conditions");
    group.throughput(criterion::Throughput::Bytes(route_stale.len() as u64));
    bench_answer(
        &mut group,
        "validate, own entries (allowed)",
        &enforce,
        &route_own,
        Endpoint::Validate,
    );
    bench_answer(
        &mut group,
        "validate, stale retry (denied)",
        &enforce,
        &route_stale,
        Endpoint::Validate,
    );
    bench_answer(
        &mut group,
        "mutate, stale retry (trimmed)",
        &trim,
        &route_stale,
        Endpoint::Mutate,
    );
    group.finish();

    // Issue 22: a CRD without `listType: map` stores duplicate condition
    // types; 10,000 of one owned type, reordered by the writer, took 11 s
    // when compared item against item.
    let reordered = reordered_items(10_000);
    eprintln!("reordered items review: {} bytes", reordered.len());
    let mut group = c.benchmark_group("many items");
    group.sample_size(20);
    group.throughput(criterion::Throughput::Bytes(reordered.len() as u64));
    group.bench_function("validate, 10,000 reordered condition items (denied)", |b| {
        b.iter(|| {
            let (_, decided) = read_and_decide(&rules, black_box(&reordered), Endpoint::Validate).expect("valid");
            let mut decision = decided.expect("decided");
            assert_eq!(decision.outcome, Outcome::Denied);
            encode_response(&mut decision.response).expect("encoded")
        })
    });
    group.finish();
}

/// A review, in the API server's member order, in which the scaler writes
/// `n` Ready items (the controller's) in the reverse order, one of them
/// changed: every item is compared, and the write is denied.
fn reordered_items(n: usize) -> Vec<u8> {
    let items: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"type": "Ready", "status": "True", "reason": "AsExpected",
                               "lastTransitionTime": "2026-12-01T10:00:00Z", "message": format!("replica {i} is ready")})
        })
        .collect();
    let mut written = items.clone();
    written.reverse();
    written[n / 2]["status"] = serde_json::json!("False");
    let object = |conditions: Vec<serde_json::Value>| {
        serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": "shop"},
                           "status": {"observedGeneration": 2, "conditions": conditions}})
    };
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"example.com","version":"v1","kind":"Widget"}},"resource":{{"group":"example.com","version":"v1","resource":"widgets"}},"subResource":"status","name":"w1","namespace":"shop","operation":"UPDATE","userInfo":{{"username":"system:serviceaccount:platform:widget-scaler"}},"object":{},"oldObject":{}}}}}"#,
        object(written),
        object(items)
    )
    .into_bytes()
}

/// The whole path of `answer`, body to encoded review, on `body` under
/// `rules`, as the server's endpoints run it.
fn bench_answer(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    rules: &Ownership,
    body: &[u8],
    endpoint: Endpoint,
) {
    group.bench_function(name, |b| {
        b.iter(|| answer(Some(rules), black_box(body), endpoint).body.len())
    });
}

criterion_group!(decision, benches);
criterion_main!(decision);
