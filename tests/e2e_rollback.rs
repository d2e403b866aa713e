//! The bug, and statusguard stopping it, on a real kube-apiserver and etcd.

mod support;

use serde_json::{Value, json};
use statusguard::rules::RulesSource;
use support::scenario::{Scenario, Written};
use support::webhook::{RunningServer, config, files, write_pair};

fn initial_status() -> Value {
    json!({"observedGeneration": 1, "replicas": 3,
           "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
                           "lastTransitionTime": "2026-12-01T10:00:00Z"}]})
}

/// statusguard with the example ownership document in `mode`, registered
/// for the scenario's namespace.
async fn guard(s: &Scenario, mode: &str) -> (RunningServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let example = include_str!("../examples/ownership.yaml").replace("mode: enforce", &format!("mode: {mode}"));
    let rules = dir.path().join("ownership.yaml");
    std::fs::write(&rules, example).unwrap();
    let server = RunningServer::start(config(RulesSource::File(rules), Some(files(dir.path())))).await;
    s.register(&server, &certs.ca_pem, mode == "trim").await;
    (server, dir)
}

/// The stale retry went through, and the client was warned about the controller's field.
fn assert_passed_with_warning(retry: &Written) {
    assert_eq!(retry.code, 200, "{:?}", retry.body);
    assert!(
        has_statusguard_warning(retry, "status.observedGeneration"),
        "{:?}",
        retry.warnings
    );
}

fn has_statusguard_warning(w: &Written, item: &str) -> bool {
    w.warnings.iter().any(|h| h.contains("statusguard") && h.contains(item))
}

#[tokio::test]
async fn without_statusguard_the_stale_retry_rolls_back_the_controllers_value() {
    let s = Scenario::new("e2e-bug").await;
    s.create_widget("w", initial_status()).await;
    let retry = s.stale_retry("w").await;
    assert_eq!(retry.code, 200, "{:?}", retry.body);
    let stored = s.get(&s.admin, "w").await;
    assert_eq!(
        stored["status"]["observedGeneration"], 1,
        "the controller's observedGeneration 2 was rolled back"
    );
    assert_eq!(stored["status"]["replicas"], 5);
}

#[tokio::test]
async fn enforce_denies_the_stale_retry_with_409_naming_the_field_and_its_owner() {
    let s = Scenario::new("e2e-enforce").await;
    let (_server, _dir) = guard(&s, "enforce").await;
    s.create_widget("w", initial_status()).await;

    let retry = s.stale_retry("w").await;
    assert_eq!(retry.code, 409, "{:?}", retry.body);
    assert_eq!(retry.body["reason"], "Conflict");
    assert!(
        retry
            .message()
            .contains("status.observedGeneration (owned by system:serviceaccount:platform:widget-controller)"),
        "{}",
        retry.message()
    );
    assert_eq!(
        s.get(&s.admin, "w").await["status"]["observedGeneration"],
        2,
        "the controller's value stays"
    );

    // The right recovery: refetch the whole object, change only its own field.
    let mut fresh = s.get(&s.scaler, "w").await;
    fresh["status"]["replicas"] = json!(5);
    let written = s.put_status(&s.scaler, &fresh).await;
    assert_eq!(written.code, 200, "{:?}", written.body);
    let stored = s.get(&s.admin, "w").await;
    assert_eq!(
        (
            stored["status"]["observedGeneration"].clone(),
            stored["status"]["replicas"].clone()
        ),
        (json!(2), json!(5))
    );

    patches_are_judged_like_a_full_update(&s, "enforce").await;

    // system:masters is exempt: the admin's stale write passes.
    let mut stale = s.get(&s.admin, "w").await;
    stale["status"]["observedGeneration"] = json!(7);
    assert_eq!(s.put_status(&s.admin, &stale).await.code, 200);
    s.unregister().await;
}

#[tokio::test]
async fn trim_keeps_the_controllers_value_stores_the_scalers_change_and_warns() {
    let s = Scenario::new("e2e-trim").await;
    let (_server, _dir) = guard(&s, "trim").await;
    s.create_widget("w", initial_status()).await;

    let retry = s.stale_retry("w").await;
    assert_passed_with_warning(&retry);
    let stored = s.get(&s.admin, "w").await;
    assert_eq!(
        stored["status"]["observedGeneration"], 2,
        "trimmed back to the controller's value"
    );
    assert_eq!(stored["status"]["replicas"], 5, "the scaler's own change is stored");

    patches_are_judged_like_a_full_update(&s, "trim").await;
    s.unregister().await;
}

#[tokio::test]
async fn audit_lets_the_stale_retry_pass_with_a_warning() {
    let s = Scenario::new("e2e-audit").await;
    let (_server, _dir) = guard(&s, "audit").await;
    s.create_widget("w", initial_status()).await;

    let retry = s.stale_retry("w").await;
    assert_passed_with_warning(&retry);
    assert_eq!(
        s.get(&s.admin, "w").await["status"]["observedGeneration"],
        1,
        "audit only reports"
    );

    patches_are_judged_like_a_full_update(&s, "audit").await;
    s.unregister().await;
}

/// A JSON merge patch and a server-side apply of status by the scaler: its
/// own fields pass in every mode; the controller's field is handled like the
/// full update.
async fn patches_are_judged_like_a_full_update(s: &Scenario, mode: &str) {
    let own = s
        .merge_patch_status(&s.scaler, "w", json!({"status": {"replicas": 6}}))
        .await;
    assert_eq!(
        (own.code, own.warnings.len()),
        (200, 0),
        "{mode}: merge patch of its own field: {:?}",
        own.body
    );
    let own = s
        .apply_status(&s.scaler, "widget-scaler", "w", json!({"replicas": 7}))
        .await;
    assert_eq!(
        (own.code, own.warnings.len()),
        (200, 0),
        "{mode}: apply of its own field: {:?}",
        own.body
    );
    assert_eq!(s.get(&s.admin, "w").await["status"]["replicas"], 7);

    let before = s.get(&s.admin, "w").await["status"]["observedGeneration"].clone();
    let merge = s
        .merge_patch_status(&s.scaler, "w", json!({"status": {"observedGeneration": 100}}))
        .await;
    let apply = s
        .apply_status(&s.scaler, "widget-scaler", "w", json!({"observedGeneration": 101}))
        .await;
    for (how, written) in [("merge patch", merge), ("apply", apply)] {
        match mode {
            "enforce" => {
                assert_eq!(written.code, 409, "{how}: {:?}", written.body);
                assert!(
                    written.message().contains("status.observedGeneration"),
                    "{how}: {}",
                    written.message()
                );
            }
            // trim and audit: the write passes, with the warning
            _ => {
                assert_eq!(written.code, 200, "{how}: {:?}", written.body);
                assert!(
                    has_statusguard_warning(&written, "status.observedGeneration"),
                    "{how}: {:?}",
                    written.warnings
                );
            }
        }
    }
    let after = s.get(&s.admin, "w").await["status"]["observedGeneration"].clone();
    if mode == "audit" {
        assert_eq!(after, 101);
    } else {
        assert_eq!(after, before, "{mode}: the controller's value stays");
    }
}

#[tokio::test]
async fn check_hints_at_service_account_writers_the_cluster_does_not_have() {
    let s = Scenario::new("e2e-check").await;
    let dir = tempfile::tempdir().unwrap();
    let document = dir.path().join("ownership.yaml");
    let text = include_str!("../examples/ownership.yaml").replace("platform/widget-scaler", "platform/widget-scalr");
    std::fs::write(&document, text).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_statusguard"))
        .arg("check")
        .arg(&document)
        .env("KUBECONFIG", &s.cluster.kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("hint: ServiceAccount platform/widget-scalr does not exist"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("platform/widget-controller does not exist"),
        "{stdout}"
    );
}
