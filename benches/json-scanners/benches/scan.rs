//! How fast each JSON library reads past a review: serde_json (what
//! statusguard reads with), sonic-rs and simd-json, on the reviews of
//! `benches/common` at 35 KB (issue 12's), 240 KB and 700 KB. Each reads the
//! whole body and builds nothing; the lazy rows find both statuses, the raw
//! text statusguard compares before it builds anything. Beside them, a skip
//! that validates nothing (brackets matched outside strings): how much
//! reading less carefully would gain.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde::de::IgnoredAny;

#[path = "../../common/mod.rs"]
mod common;

const ONES: u64 = u64::MAX / 255;

/// The high bit of each byte of `word` that is `byte`.
fn bytes_equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & (ONES << 7)
}

/// The end of the object or list at `at`, with its brackets matched outside
/// strings and nothing else checked; eight bytes at a time to the next
/// quote, bracket or backslash.
fn structural_end(text: &[u8], mut at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    loop {
        while let Some(eight) = text.get(at..at + 8) {
            let word = u64::from_le_bytes(eight.try_into().ok()?);
            let found = if in_string {
                bytes_equal(word, b'"') | bytes_equal(word, b'\\')
            } else {
                // `{` and `[` differ by one bit, as do `}` and `]`.
                let folded = word & (ONES * 0xDF);
                bytes_equal(word, b'"') | bytes_equal(folded, b'[') | bytes_equal(folded, b']')
            };
            if found != 0 {
                at += found.trailing_zeros() as usize / 8;
                break;
            }
            at += 8;
        }
        match (*text.get(at)?, in_string) {
            (b'"', _) => in_string = !in_string,
            (b'\\', true) => at += 1,
            (b'{' | b'[', false) => depth += 1,
            (b'}' | b']', false) => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

/// The two statuses' text, found with sonic-rs's lazy iterators (checked:
/// the rest of the body is validated as it is skipped).
fn sonic_statuses(body: &[u8]) -> usize {
    let mut found = 0;
    for (key, request) in sonic_rs::to_object_iter(body).flatten() {
        if key != "request" {
            continue;
        }
        for (key, object) in sonic_rs::to_object_iter(request.as_raw_str()).flatten() {
            if key == "object" || key == "oldObject" {
                for (key, value) in sonic_rs::to_object_iter(object.as_raw_str()).flatten() {
                    if key == "status" {
                        found += value.as_raw_str().len();
                    }
                }
            }
        }
    }
    found
}

fn scanners(c: &mut Criterion) {
    for (label, shape) in [
        ("35 KB", common::Shape::DEFAULT),
        ("240 KB", common::Shape::sized(240_000)),
        ("700 KB", common::Shape::sized(700_000)),
    ] {
        let body = common::review_shaped(true, shape);
        assert_eq!(structural_end(&body, 0), Some(body.len()));
        let mut group = c.benchmark_group(format!("scan a {label} review"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("serde_json, IgnoredAny", |b| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(&body).map(|_| ()))
        });
        group.bench_function("serde_json, &RawValue", |b| {
            b.iter(|| serde_json::from_slice::<&serde_json::value::RawValue>(&body).map(|r| r.get().len()))
        });
        group.bench_function("a skip that validates nothing", |b| b.iter(|| structural_end(&body, 0)));
        group.bench_function("sonic-rs, IgnoredAny", |b| {
            b.iter(|| sonic_rs::from_slice::<IgnoredAny>(&body).map(|_| ()))
        });
        group.bench_function("sonic-rs, lazy to both statuses", |b| b.iter(|| sonic_statuses(&body)));
        // simd-json parses in place: the copy is part of its cost.
        group.bench_function("simd-json, IgnoredAny (on a copy)", |b| {
            b.iter(|| {
                let mut copy = body.clone();
                simd_json::serde::from_slice::<IgnoredAny>(&mut copy).map(|_| ())
            })
        });
        group.bench_function("simd-json, borrowed value (on a copy)", |b| {
            b.iter(|| {
                let mut copy = body.clone();
                simd_json::to_borrowed_value(&mut copy).map(|v| std::mem::size_of_val(&v))
            })
        });
        group.finish();
    }
}

criterion_group!(benches, scanners);
criterion_main!(benches);
