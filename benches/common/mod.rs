//! A 16 KiB Widget written by one of four writers: the review the benchmarks answer.
#![allow(dead_code)]

use serde_json::{Value, json};

/// The shared fixture, in trim mode (the costliest).
pub fn ownership() -> String {
    include_str!("../../tests/fixtures/ownership.yaml").replace("mode: enforce", "mode: trim")
}

fn status(observed_generation: i64, replicas: i64) -> Value {
    let types = ["Ready", "Progressing", "Scaled", "Healthy", "Degraded", "Reviewed"];
    let conditions: Vec<Value> = (0..24)
        .map(|i| {
            let ty = if i < types.len() {
                types[i].to_owned()
            } else {
                format!("Extra{i}")
            };
            json!({"type": ty, "status": "True", "reason": "AsExpected", "observedGeneration": observed_generation,
                   "lastTransitionTime": "2026-12-01T10:00:00Z", "message": "x".repeat(200)})
        })
        .collect();
    json!({
        "observedGeneration": observed_generation,
        "replicas": replicas,
        "scale": {"lastScaleTime": "2026-12-01T10:00:00Z"},
        "summary": {"ready": 3, "total": 3, "details": {"ready": 3, "pods": (0..20).map(|i| format!("pod-{i}")).collect::<Vec<_>>()}},
        "health": {"score": 97, "checks": (0..10).map(|i| json!({"name": format!("check-{i}"), "ok": true})).collect::<Vec<_>>()},
        "notes": "n".repeat(2000),
        "conditions": conditions,
    })
}

/// An AdmissionReview of about 16 KiB per object: the scaler's stale retry
/// (`stale = true`) or a write of only its own field.
pub fn review(stale: bool) -> Value {
    let old = status(2, 3);
    let new = if stale {
        status(1, 5)
    } else {
        let mut s = old.clone();
        s["replicas"] = json!(5);
        s
    };
    let object = |status: Value| {
        json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "shop", "uid": "6b1f0f5e", "resourceVersion": "1002", "generation": 2,
                         "labels": {"app": "shop"}, "annotations": {"note": "a".repeat(1500)}},
            "spec": {"size": 3, "template": "t".repeat(4000)},
            "status": status,
        })
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
        "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
        "subResource": "status", "name": "w1", "namespace": "shop", "operation": "UPDATE",
        "userInfo": {"username": "system:serviceaccount:platform:widget-scaler", "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": object(new), "oldObject": object(old), "dryRun": false,
    }})
}
