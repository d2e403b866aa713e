//! The reviews the benchmarks answer: by default a Widget of about 17 KiB
//! per object (35 KB in all), 24 conditions and 120 endpoint entries in the
//! status, written by one of four writers; and the null webhook they are
//! compared with.
#![allow(dead_code)]

use serde_json::{Value, json};

/// The shared fixture, in trim mode (the costliest).
pub fn ownership() -> String {
    include_str!("../../tests/fixtures/ownership.yaml").replace("mode: enforce", "mode: trim")
}

/// [`ownership`] with the status's largest value, `endpoints`, owned by a
/// fourth writer (alice), whom the stale write does not concern (issue 25).
pub fn ownership_endpoints_owned() -> String {
    let owned = ownership().replace("fields: [notes]", "fields: [notes, endpoints]");
    assert_ne!(owned, ownership(), "the fixture names alice's fields as expected");
    owned
}

/// The shape of a benchmark review.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub conditions: usize,
    pub endpoints: usize,
    pub message_bytes: usize,
    pub template_bytes: usize,
}

impl Shape {
    /// The review of issue 12: 35 KB, 24 conditions, 120 endpoints.
    pub const DEFAULT: Shape = Shape {
        conditions: 24,
        endpoints: 120,
        message_bytes: 200,
        template_bytes: 1200,
    };

    /// About `bytes` in all (two objects), from 1 KB up.
    pub fn sized(bytes: usize) -> Shape {
        if bytes <= 4096 {
            Shape {
                conditions: 2,
                endpoints: 0,
                message_bytes: 10,
                template_bytes: 0,
            }
        } else {
            // An endpoint entry is about 70 bytes per object.
            Shape {
                endpoints: bytes.saturating_sub(24_000) / 140,
                ..Shape::DEFAULT
            }
        }
    }
}

/// A Widget's status of `shape`: its conditions observe `observed_generation`.
pub fn status(observed_generation: i64, replicas: i64, shape: Shape) -> Value {
    let types = ["Ready", "Progressing", "Scaled", "Healthy", "Degraded", "Reviewed"];
    let conditions: Vec<Value> = (0..shape.conditions)
        .map(|i| {
            let ty = if i < types.len() {
                types[i].to_owned()
            } else {
                format!("Extra{i}")
            };
            json!({"type": ty, "status": "True", "reason": "AsExpected", "observedGeneration": observed_generation,
                   "lastTransitionTime": "2026-12-01T10:00:00Z", "message": "x".repeat(shape.message_bytes)})
        })
        .collect();
    json!({
        "observedGeneration": observed_generation,
        "replicas": replicas,
        "scale": {"lastScaleTime": "2026-12-01T10:00:00Z"},
        "summary": {"ready": 3, "total": 3, "details": {"ready": 3, "pods": (0..20).map(|i| format!("pod-{i}")).collect::<Vec<_>>()}},
        "health": {"score": 97, "checks": (0..10).map(|i| json!({"name": format!("check-{i}"), "ok": true})).collect::<Vec<_>>()},
        "notes": "n".repeat(200),
        "endpoints": (0..shape.endpoints)
            .map(|i| json!({"ip": format!("10.1.{}.{}", i / 250, i % 250), "port": 8080, "ready": true, "zone": "a"}))
            .collect::<Vec<_>>(),
        "conditions": conditions,
    })
}

/// An AdmissionReview of about 16 KiB per object: the scaler's stale retry
/// (`stale = true`) or a write of only its own field.
pub fn review(stale: bool) -> Vec<u8> {
    review_shaped(stale, Shape::DEFAULT)
}

/// [`review`] of another shape, as the API server writes it: the request's
/// members in the order of Go's `AdmissionRequest` (the objects after the
/// head), each object's members sorted, as Go writes a map.
pub fn review_shaped(stale: bool, shape: Shape) -> Vec<u8> {
    let old = status(2, 3, shape);
    let new = if stale {
        status(1, 5, shape)
    } else {
        let mut s = old.clone();
        s["replicas"] = json!(5);
        s
    };
    review_of(old, new, shape)
}

/// The scaler's write of status `new` over `old`, in objects of `shape`,
/// written as [`review_shaped`] writes it.
pub fn review_of(old: Value, new: Value, shape: Shape) -> Vec<u8> {
    let object = |status: Value| {
        json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "shop", "uid": "6b1f0f5e", "resourceVersion": "1002", "generation": 2,
                         "labels": {"app": "shop"}, "annotations": {"note": "a".repeat(shape.template_bytes / 4)}},
            "spec": {"size": 3, "template": "t".repeat(shape.template_bytes)},
            "status": status,
        })
    };
    let members: [(&str, Value); 11] = [
        ("uid", json!("705ab4f5-6393-11e8-b7cc-42010a800002")),
        (
            "kind",
            json!({"group": "example.com", "version": "v1", "kind": "Widget"}),
        ),
        (
            "resource",
            json!({"group": "example.com", "version": "v1", "resource": "widgets"}),
        ),
        ("subResource", json!("status")),
        ("name", json!("w1")),
        ("namespace", json!("shop")),
        ("operation", json!("UPDATE")),
        (
            "userInfo",
            json!({"username": "system:serviceaccount:platform:widget-scaler", "groups": ["system:serviceaccounts", "system:authenticated"]}),
        ),
        ("object", object(new)),
        ("oldObject", object(old)),
        ("dryRun", json!(false)),
    ];
    let request: Vec<String> = members
        .iter()
        .map(|(key, value)| format!("{}:{}", json!(key), value))
        .collect();
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{{}}}}}"#,
        request.join(",")
    )
    .into_bytes()
}

/// Rules with `resources` guarded resources (widgets first) and `writers`
/// writers of widgets: the widget controller (whose items the stale write
/// changes) and others that own items the review does not hold. For the
/// configuration sweeps.
pub fn ownership_scaled(resources: usize, writers: usize) -> String {
    let mut text = String::from(
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nmode: enforce\nresources:\n  - group: example.com\n    resource: widgets\n    writers:\n      - {serviceAccount: platform/widget-controller, fields: [observedGeneration, summary], conditions: [Ready, Progressing]}\n",
    );
    for i in 1..writers {
        text += &format!("      - {{user: writer-{i}@example.com, fields: [sweep{i}], conditions: [Sweep{i}]}}\n");
    }
    for i in 1..resources {
        text += &format!(
            "  - group: sweep{i}.example.com\n    resource: things\n    writers:\n      - {{user: a, fields: [x], conditions: [Ready]}}\n"
        );
    }
    text
}

/// The null webhook: the same rustls (ring) + hyper-util + axum stack and
/// accept loop as statusguard, reading the whole body and answering
/// "allowed" without parsing anything. It echoes the first `"uid":"…"` it
/// finds, because the API server checks the response's uid: that is the
/// request's uid in the API server's own encoding, which writes it first.
/// The physical limit.
pub fn null_router() -> axum::Router {
    let answer = |body: axum::body::Bytes| async move {
        spin_as_configured();
        const KEY: &[u8] = br#""uid":""#;
        let uid = body
            .windows(KEY.len())
            .position(|w| w == KEY)
            .and_then(|at| {
                let rest = &body[at + KEY.len()..];
                let end = rest.iter().position(|&b| b == b'"')?;
                std::str::from_utf8(&rest[..end]).ok()
            })
            .unwrap_or_default();
        let allowed = format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":"{uid}","allowed":true}}}}"#
        );
        ([("content-type", "application/json")], allowed)
    };
    axum::Router::new()
        .route("/validate", axum::routing::post(answer))
        .route("/mutate", axum::routing::post(answer))
}

/// With `NULL_SPIN_NS` set, the null webhook spins that long per review
/// before it answers, touching no memory: a server whose decision costs
/// exactly that and nothing else. Measured beside statusguard, it tells
/// what the same stack costs a server as slow as statusguard from what
/// statusguard's own request path adds (BENCHMARKS.md, "a null webhook as
/// slow as statusguard").
fn spin_as_configured() {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    let spin = *SPIN.get_or_init(|| {
        let nanos = std::env::var("NULL_SPIN_NS").ok().and_then(|v| v.parse().ok());
        std::time::Duration::from_nanos(nanos.unwrap_or(0))
    });
    if spin.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < spin {
        std::hint::spin_loop();
    }
}
