//! The two engines side by side on the real kube-apiserver: the same
//! ownership document enforced by the webhook in one namespace and by the
//! exported ValidatingAdmissionPolicy / MutatingAdmissionPolicy in another,
//! and the same writes sent to both. Every answer and every stored result
//! must agree, except the documented deviations (README, "Webhook or
//! policies?"), which are asserted as such.
//!
//! The randomized run generates, per mode, a document and then cases
//! (stored status, written status, writer) from a seed
//! (`STATUSGUARD_POLICY_SEED`, printed on failure) and writes each with
//! dry-run, so that a case costs two admin writes and two dry-run writes.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use serde_json::{Value, json};
use statusguard::ownership::Ownership;
use statusguard::policies::api_resource;
use statusguard::rules::RulesSource;
use support::cluster;
use support::scenario::{CONTROLLER, SCALER, Scenario, Written, send};
use support::webhook::{RunningServer, config, files, write_pair};

/// A writer the document never names.
const OTHER: (&str, &str) = ("platform", "widget-other");
const WEBHOOK_NS: &str = "engines-webhook";
const POLICIES_NS: &str = "engines-policies";
const PREFIX: &str = "sgtest";
const CASES_PER_MODE: usize = 170;
const BEYOND_2_53: u64 = 9_007_199_254_740_993;

/// The tests share the namespaces, the webhook configurations and the
/// policies' names: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A small deterministic generator: the seed reproduces a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn username((ns, name): (&str, &str)) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

/// A document over the Widget's schema: `note` is always the scaler's (the
/// probe that tells when the policies are in force); every other field,
/// condition type and `checks` entry goes to the controller, the scaler or
/// nobody.
fn random_document(rng: &mut Rng, mode: &str) -> String {
    let (mut controller, mut scaler) = (
        (Vec::<&str>::new(), Vec::<&str>::new(), Vec::<&str>::new()),
        (vec!["note"], Vec::<&str>::new(), Vec::<&str>::new()),
    );
    let fields: [&[&str]; 7] = [
        &["observedGeneration"],
        &["replicas"],
        &["bigNumber"],
        &["summary", "summary.details"],
        &["scale.lastScaleTime"],
        &["extra"],
        // `deep.x` is sometimes a list: `deep.x.p` is then absent.
        &["deep", "deep.x", "deep.x.p"],
    ];
    for choices in fields {
        let field = *rng.pick(choices);
        match rng.below(3) {
            0 => controller.0.push(field),
            1 => scaler.0.push(field),
            _ => {}
        }
    }
    for ty in ["Ready", "Scaled", "Synced"] {
        match rng.below(3) {
            0 => controller.1.push(ty),
            1 => scaler.1.push(ty),
            _ => {}
        }
    }
    for value in ["alpha", "beta"] {
        match rng.below(3) {
            0 => controller.2.push(value),
            1 => scaler.2.push(value),
            _ => {}
        }
    }
    let writer = |sa: (&str, &str), owned: &(Vec<&str>, Vec<&str>, Vec<&str>)| {
        json!({
            "serviceAccount": format!("{}/{}", sa.0, sa.1),
            "fields": owned.0, "conditions": owned.1, "entries": {"checks": owned.2},
        })
    };
    let doc = json!({
        "apiVersion": "statusguard.dev/v1alpha1", "kind": "StatusOwnership", "mode": mode,
        "exempt": {"groups": ["system:masters"]},
        "resources": [{
            "group": "example.com", "resource": "widgets",
            "lists": [{"path": "checks", "key": "type"}],
            "writers": [writer(CONTROLLER, &controller), writer(SCALER, &scaler)],
        }],
    });
    // JSON is YAML.
    doc.to_string()
}

/// A JSON value a few levels deep, with `null` members and items.
fn random_json(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.below(3)),
        2 => json!(*rng.pick(&["a", "b"])),
        3 => json!(rng.chance(50)),
        4 => json!(rng.below(2) as f64 + 0.5),
        5 => {
            let mut map = serde_json::Map::new();
            for key in ["p", "q", "r"] {
                if rng.chance(50) {
                    map.insert(key.to_owned(), random_json(rng, depth - 1));
                }
            }
            Value::Object(map)
        }
        _ => Value::Array((0..rng.below(3)).map(|_| random_json(rng, depth - 1)).collect()),
    }
}

fn random_items(rng: &mut Rng, types: &[&str]) -> Value {
    let mut items = Vec::new();
    for ty in types {
        if rng.chance(60) {
            let mut item = json!({"type": ty, "status": rng.pick(&["True", "False", "Unknown"])});
            if rng.chance(40) {
                item["reason"] = json!(rng.pick(&["A", "B"]));
            }
            if rng.chance(20) {
                item["observedGeneration"] = json!(rng.below(3));
            }
            items.push(item);
        }
    }
    Value::Array(items)
}

/// The value of one status member, or `None` for absent.
fn random_member(rng: &mut Rng, key: &str) -> Option<Value> {
    if rng.chance(20) {
        return None;
    }
    Some(match key {
        "observedGeneration" | "replicas" => json!(rng.below(4)),
        "bigNumber" => {
            if rng.chance(50) {
                json!(BEYOND_2_53)
            } else {
                json!(rng.below(3))
            }
        }
        "note" => json!(rng.pick(&["a", "b", "c"])),
        "summary" => {
            let mut summary = json!({"ready": rng.below(3)});
            if rng.chance(50) {
                summary["details"] = json!({"ready": rng.below(3)});
            }
            summary
        }
        "scale" => json!({"lastScaleTime": rng.pick(&["t1", "t2"])}),
        "extra" => match rng.below(3) {
            0 => Value::Null,
            1 => json!({"a": rng.pick(&["x", "y"]), "c": Value::Null}),
            _ => json!({"a": rng.pick(&["x", "y"]), "b": rng.below(2)}),
        },
        "deep" => json!({"x": random_json(rng, 3), "y": random_json(rng, 1)}),
        "conditions" => random_items(rng, &["Ready", "Scaled", "Synced", "Other"]),
        "checks" => random_items(rng, &["alpha", "beta", "gamma"]),
        _ => unreachable!("{key}"),
    })
}

const MEMBERS: [&str; 11] = [
    "observedGeneration",
    "replicas",
    "bigNumber",
    "note",
    "summary",
    "scale",
    "extra",
    "deep",
    "conditions",
    "checks",
    "checks",
];

fn random_status(rng: &mut Rng) -> Value {
    let mut status = serde_json::Map::new();
    for key in MEMBERS {
        if let Some(value) = random_member(rng, key) {
            status.insert(key.to_owned(), value);
        }
    }
    Value::Object(status)
}

/// `value` with every integer written as a double (`1` as `1.0`), as a
/// client whose numbers are floats writes it.
fn as_doubles(value: &Value) -> Value {
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => n.as_f64().map_or(Value::Null, |f| json!(f)),
        Value::Array(items) => Value::Array(items.iter().map(as_doubles).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), as_doubles(v))).collect()),
        other => other.clone(),
    }
}

/// A write from `stored`: a few members changed, sometimes none, sometimes
/// only `null` members added (the same value, as the webhook sees it),
/// sometimes the lists reordered, the numbers of `deep` written as doubles
/// (the same value too), the whole status dropped, or one condition written
/// where the stored status may have none.
fn random_write(rng: &mut Rng, stored: &Value) -> Value {
    let mut written = stored.clone();
    let Some(map) = written.as_object_mut() else {
        return written;
    };
    match rng.below(13) {
        10 => {
            if let Some(deep) = map.get_mut("deep") {
                *deep = as_doubles(deep);
            }
        }
        11 => map.clear(),
        12 => {
            let ty = *rng.pick(&["Ready", "Scaled", "Synced"]);
            map.insert("conditions".to_owned(), json!([{"type": ty, "status": "True"}]));
        }
        0 => {}
        1 => {
            if let Some(Value::Object(x)) = map.get_mut("deep").and_then(|d| d.get_mut("x")) {
                x.insert("n".to_owned(), Value::Null);
            }
            if let Some(Value::Object(extra)) = map.get_mut("extra") {
                extra.insert("c".to_owned(), Value::Null);
            }
        }
        2 => {
            for key in ["conditions", "checks"] {
                if let Some(Value::Array(items)) = map.get_mut(key) {
                    items.reverse();
                }
            }
        }
        _ => {
            for _ in 0..1 + rng.below(3) {
                let key = *rng.pick(&MEMBERS);
                match random_member(rng, key) {
                    Some(value) => map.insert(key.to_owned(), value),
                    None => map.remove(key),
                };
            }
        }
    }
    written
}

/// Applies the exported policies of `doc`, their bindings narrowed to the
/// policies' namespace.
async fn apply_policies(admin: &Client, doc: &str) {
    let rules = Ownership::from_yaml(doc).unwrap();
    for mut object in statusguard::policies::policies(PREFIX, &rules) {
        let kind = object["kind"].as_str().unwrap().to_owned();
        if kind.ends_with("Binding") {
            object["spec"]["matchResources"] =
                json!({"namespaceSelector": {"matchLabels": {"statusguard-test": POLICIES_NS}}});
        }
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &api_resource(&kind));
        api.patch(
            &name,
            &PatchParams::apply("e2e-policies").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("{kind} {name} is refused by the API server: {e}"));
    }
}

async fn delete_policies(admin: &Client) {
    for kind in [
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
    ] {
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &api_resource(kind));
        let _ = api
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("app.kubernetes.io/managed-by=statusguard"),
            )
            .await;
    }
}

/// Both engines' namespaces, the widget each case is written to, and the writers.
struct Engines {
    webhook: Scenario,
    policies: Scenario,
    other: Client,
}

impl Engines {
    async fn new() -> Self {
        let webhook = Scenario::new(WEBHOOK_NS).await;
        let policies = Scenario::new(POLICIES_NS).await;
        cluster::service_account(&webhook.admin, OTHER.0, OTHER.1).await;
        cluster::grant_widget_writers(&webhook.admin, &[CONTROLLER, SCALER, OTHER]).await;
        let other = webhook.cluster.service_account_client(OTHER.0, OTHER.1).await;
        for s in [&webhook, &policies] {
            if cluster::widgets(&s.admin, &s.namespace)
                .get_opt("case")
                .await
                .unwrap()
                .is_none()
            {
                s.create_widget("case", json!({})).await;
            }
        }
        Self {
            webhook,
            policies,
            other,
        }
    }

    /// The writer's client: 0 controller, 1 scaler, 2 a writer not in the
    /// document, 3 the admin (exempt).
    fn writer(&self, which: usize) -> (&Client, String) {
        match which {
            0 => (&self.webhook.controller, username(CONTROLLER)),
            1 => (&self.webhook.scaler, username(SCALER)),
            2 => (&self.other, username(OTHER)),
            _ => (&self.webhook.admin, "admin".to_owned()),
        }
    }
}

/// Stores `stored` (as the exempt admin), then writes `written` as
/// `writer` with dry-run: the answer.
async fn case(s: &Scenario, writer: &Client, stored: &Value, written: &Value) -> Written {
    let mut object = s.get(&s.admin, "case").await;
    object["status"] = stored.clone();
    let put = s.put_status(&s.admin, &object).await;
    assert_eq!(put.code, 200, "storing {stored}: {:?}", put.body);
    let mut object = put.body;
    object["status"] = written.clone();
    dry_run_status(s, writer, &object).await
}

async fn dry_run_status(s: &Scenario, writer: &Client, object: &Value) -> Written {
    let request = Request::new(format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace))
        .replace_subresource(
            "status",
            "case",
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            serde_json::to_vec(object).unwrap(),
        )
        .unwrap();
    send(writer, request).await
}

/// What a warning says once the API server's prefix for a policy's is gone.
fn warning_text(warning: &str) -> String {
    // `299 - "<text>"`, and for a policy `Validation failed for ... : <text>`.
    let text = warning.trim_start_matches("299 - ").trim_matches('"');
    match text.split_once("': ") {
        Some((_, rest)) if text.starts_with("Validation failed") => rest.to_owned(),
        _ => text.to_owned(),
    }
}

/// How the two engines' answers to one case compare.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Agreement {
    /// Same decision, same stored result, same warnings.
    Same,
    /// Both denied: 409 Conflict from the webhook, 403 Forbidden from the policy.
    DeniedConflictVersusForbidden,
    /// Trim restored, the webhook with warnings, the policy silently.
    TrimSilent,
    /// Trim would restore a number beyond 2^53: the webhook restores it,
    /// the policy leaves it to the Deny backstop.
    TrimBeyond2To53,
}

fn status_of(written: &Written) -> Value {
    written.body.get("status").cloned().unwrap_or(Value::Null)
}

/// Compares one case's answers; `Err` describes an unexplained difference.
fn compare(mode: &str, stored: &Value, webhook: &Written, policies: &Written) -> Result<Agreement, String> {
    let describe = || {
        format!(
            "webhook {} {:?} {}; policies {} {:?} {}",
            webhook.code,
            webhook.warnings,
            if webhook.code == 200 {
                status_of(webhook)
            } else {
                webhook.body["message"].clone()
            },
            policies.code,
            policies.warnings,
            if policies.code == 200 {
                status_of(policies)
            } else {
                policies.body["message"].clone()
            },
        )
    };
    match (webhook.code, policies.code) {
        (409, 403) => {
            // The same violations, in the same words.
            let words = |w: &Written| {
                let message = w.body["message"].as_str().unwrap_or_default();
                message
                    .split_once("statusguard: ")
                    .map(|(_, rest)| rest.to_owned())
                    .unwrap_or_default()
            };
            if words(webhook) == words(policies) {
                Ok(Agreement::DeniedConflictVersusForbidden)
            } else {
                Err(describe())
            }
        }
        (200, 200) => {
            if status_of(webhook) != status_of(policies) {
                return Err(describe());
            }
            let warnings = |w: &Written| -> BTreeSet<String> { w.warnings.iter().map(|t| warning_text(t)).collect() };
            if warnings(webhook) == warnings(policies) {
                Ok(Agreement::Same)
            } else if mode == "trim" && policies.warnings.is_empty() {
                Ok(Agreement::TrimSilent)
            } else {
                Err(describe())
            }
        }
        (200, 403)
            if mode == "trim"
                && stored.get("bigNumber") == Some(&json!(BEYOND_2_53))
                && status_of(webhook).get("bigNumber") == Some(&json!(BEYOND_2_53)) =>
        {
            Ok(Agreement::TrimBeyond2To53)
        }
        _ => Err(describe()),
    }
}

/// Waits until the policies of `mode` decide in the policies' namespace:
/// the controller's change of the scaler's `note` is answered as `mode` does.
async fn wait_for_policies(engines: &Engines, mode: &str) {
    let s = &engines.policies;
    support::wait::retry_until(Duration::from_secs(30), "the policies take effect", || async {
        let answer = case(s, &s.controller, &json!({"note": "a"}), &json!({"note": "probe"})).await;
        let in_force = match mode {
            "enforce" => answer.code == 403,
            "trim" => answer.code == 200 && status_of(&answer)["note"] == json!("a"),
            _ => answer.code == 200 && !answer.warnings.is_empty(),
        };
        if in_force {
            Ok(())
        } else {
            Err(format!("{} {:?} {}", answer.code, answer.warnings, answer.body))
        }
    })
    .await
}

/// statusguard's webhook on `doc`, registered for the webhook's namespace.
async fn start_webhook(engines: &Engines, doc: &str, mode: &str) -> (RunningServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let rules = dir.path().join("ownership.yaml");
    std::fs::write(&rules, doc).unwrap();
    let server = RunningServer::start(config(RulesSource::File(rules), Some(files(dir.path())))).await;
    engines.webhook.register(&server, &certs.ca_pem, mode == "trim").await;
    (server, dir)
}

/// Both engines on `doc` in `mode`: the webhook registered for its
/// namespace, and only `doc`'s policies (a previous document's are deleted
/// first) bound to theirs. The caller waits until the policies decide.
async fn guard_both(engines: &Engines, doc: &str, mode: &str) -> (RunningServer, tempfile::TempDir) {
    let webhook = start_webhook(engines, doc, mode).await;
    delete_policies(&engines.webhook.admin).await;
    apply_policies(&engines.webhook.admin, doc).await;
    webhook
}

fn seed() -> u64 {
    std::env::var("STATUSGUARD_POLICY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5747_4755_4152_4421)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_cases_decide_alike_on_both_engines() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let engines = Engines::new().await;
    let seed = seed();
    let mut rng = Rng(seed);
    let mut unexplained = Vec::new();
    let mut counts = std::collections::BTreeMap::new();
    let mut cases = 0;
    // Audit before trim: each mode's objects replace the last's, and only
    // trim has a MutatingAdmissionPolicy.
    for mode in ["enforce", "audit", "trim"] {
        let doc = random_document(&mut rng, mode);
        let (_server, _dir) = start_webhook(&engines, &doc, mode).await;
        apply_policies(&engines.webhook.admin, &doc).await;
        wait_for_policies(&engines, mode).await;
        for _ in 0..CASES_PER_MODE {
            let stored = random_status(&mut rng);
            let written = random_write(&mut rng, &stored);
            let (writer, name) = engines.writer(rng.below(4));
            let by_webhook = case(&engines.webhook, writer, &stored, &written).await;
            let by_policies = case(&engines.policies, writer, &stored, &written).await;
            cases += 1;
            match compare(mode, &stored, &by_webhook, &by_policies) {
                Ok(agreement) => *counts.entry(agreement).or_insert(0) += 1,
                Err(difference) => unexplained.push(format!(
                    "mode {mode}, writer {name}\n  document {doc}\n  stored {stored}\n  written {written}\n  {difference}"
                )),
            }
        }
        // The next server listens elsewhere: its configurations are made anew.
        engines.webhook.unregister().await;
    }
    delete_policies(&engines.webhook.admin).await;
    println!("{cases} cases (seed {seed}): {counts:?}");
    assert!(cases >= 500);
    assert!(
        unexplained.is_empty(),
        "{} of {cases} cases differ unexplained (seed {seed}, STATUSGUARD_POLICY_SEED reproduces):\n{}",
        unexplained.len(),
        unexplained.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
    // The deviations are really met, not only allowed.
    assert!(
        counts.contains_key(&Agreement::DeniedConflictVersusForbidden),
        "{counts:?}"
    );
    assert!(counts.contains_key(&Agreement::Same), "{counts:?}");
}

/// A document for the deviations: the scaler owns `note` (the probe),
/// `bigNumber` and `deep`; the controller `observedGeneration`.
fn deviations_document(mode: &str) -> String {
    json!({
        "apiVersion": "statusguard.dev/v1alpha1", "kind": "StatusOwnership", "mode": mode,
        "exempt": {"groups": ["system:masters"]},
        "resources": [{"group": "example.com", "resource": "widgets", "writers": [
            {"serviceAccount": format!("{}/{}", CONTROLLER.0, CONTROLLER.1), "fields": ["observedGeneration"]},
            {"serviceAccount": format!("{}/{}", SCALER.0, SCALER.1), "fields": ["note", "bigNumber", "deep"]},
        ]}],
    })
    .to_string()
}

/// One write to both engines, as the controller.
async fn both(engines: &Engines, stored: &Value, written: &Value) -> (Written, Written) {
    let controller = &engines.webhook.controller;
    (
        case(&engines.webhook, controller, stored, written).await,
        case(&engines.policies, controller, stored, written).await,
    )
}

/// Each row of the README's deviations table, shown on the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_deviations_are_what_the_api_server_does() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let engines = Engines::new().await;

    // Trim, a restored number beyond 2^53: the webhook restores it exactly;
    // the policy leaves it to the Deny backstop (JSONPatch would write a string).
    let doc = deviations_document("trim");
    let (server, dir) = start_webhook(&engines, &doc, "trim").await;
    apply_policies(&engines.webhook.admin, &doc).await;
    wait_for_policies(&engines, "trim").await;
    let stored = json!({"bigNumber": BEYOND_2_53, "note": "a"});
    // The probe above saw the mutating policy in force; the API server may
    // take the validating one (the backstop) into force a moment later.
    let (webhook, policies) = support::wait::retry_until(
        Duration::from_secs(30),
        "the Deny backstop refuses an unrestorable number",
        || async {
            let (webhook, policies) = both(&engines, &stored, &json!({"bigNumber": 1, "note": "a"})).await;
            if policies.code == 403 {
                Ok((webhook, policies))
            } else {
                Err(format!("{} {}", policies.code, status_of(&policies)))
            }
        },
    )
    .await;
    assert_eq!(webhook.code, 200, "{:?}", webhook.body);
    assert_eq!(status_of(&webhook)["bigNumber"], json!(BEYOND_2_53));
    assert!(!webhook.warnings.is_empty(), "the webhook says what it restored");
    assert_eq!(policies.code, 403, "{:?}", policies.body);
    // Trim is silent: restored, with no warning.
    let (webhook, policies) = both(&engines, &stored, &json!({"bigNumber": BEYOND_2_53, "note": "b"})).await;
    assert_eq!((webhook.code, policies.code), (200, 200));
    assert_eq!(status_of(&webhook), status_of(&policies));
    assert_eq!(status_of(&policies)["note"], json!("a"));
    assert!(!webhook.warnings.is_empty() && policies.warnings.is_empty());
    drop((server, dir));
    engines.webhook.unregister().await;
    // Enforce has no MutatingAdmissionPolicy: trim's must go.
    delete_policies(&engines.webhook.admin).await;

    let doc = deviations_document("enforce");
    let (server, dir) = start_webhook(&engines, &doc, "enforce").await;
    apply_policies(&engines.webhook.admin, &doc).await;
    wait_for_policies(&engines, "enforce").await;

    // A denial is 409 Conflict from the webhook, 403 Forbidden from a policy,
    // with the same words.
    let (webhook, policies) = both(&engines, &json!({"note": "a"}), &json!({"note": "b"})).await;
    assert_eq!((webhook.code, policies.code), (409, 403));

    // `null` and absent alike up to NULL_DEPTH levels inside an owned value...
    let nested = |inner: Value| json!({"deep": {"a": {"b": {"c": inner}}}});
    let (webhook, policies) = both(&engines, &nested(json!({})), &nested(json!({"d": null}))).await;
    assert_eq!((webhook.code, policies.code), (200, 200), "{:?}", policies.body);
    // ... and below that CEL's `==`, for which they differ.
    let (webhook, policies) = both(&engines, &nested(json!({"d": {}})), &nested(json!({"d": {"e": null}}))).await;
    assert_eq!((webhook.code, policies.code), (200, 403), "{:?}", policies.body);

    // Numbers of the same value and another kind are different numbers to both.
    let (webhook, policies) = both(&engines, &json!({"deep": {"n": 1}}), &json!({"deep": {"n": 1.5}})).await;
    assert_eq!((webhook.code, policies.code), (409, 403));

    // The runtime cost budget: a large owned value is compared within it up
    // to a size, beyond which the policy refuses every write by another writer.
    for members in [1_000usize, 3_000, 10_000] {
        let big = json!({"deep": {"items": (0..members).map(|i| json!({"a": i})).collect::<Vec<_>>()}, "note": "a"});
        let mut written = big.clone();
        written["observedGeneration"] = json!(1);
        let started = std::time::Instant::now();
        let (webhook, policies) = both(&engines, &big, &written).await;
        println!(
            "{members} owned list items: webhook {}, policies {} {} ({:?} for both)",
            webhook.code,
            policies.code,
            policies.body["message"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect::<String>(),
            started.elapsed()
        );
        assert_eq!(webhook.code, 200);
        // Measured on kube-apiserver 1.36.3: 3,000 items fit the budget,
        // 10,000 do not (the README's safe size).
        let within_budget = members <= 3_000;
        assert_eq!(
            policies.code,
            if within_budget { 200 } else { 422 },
            "{:?}",
            policies.body
        );
    }
    drop((server, dir));
    engines.webhook.unregister().await;
    delete_policies(&engines.webhook.admin).await;
}

/// Writes that once split the engines, each decided alike in enforce and
/// in trim: several restored fields under an object the write dropped (or
/// with no status at all), a conditions list left empty by the trim where
/// the stored status had none, an owned path below a member that is a list,
/// and a client's whole doubles (`1.0`, stored and reviewed as `1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_drop_parents_or_change_kinds_decide_alike() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let engines = Engines::new().await;
    let document = |mode: &str| {
        json!({
            "apiVersion": "statusguard.dev/v1alpha1", "kind": "StatusOwnership", "mode": mode,
            "exempt": {"groups": ["system:masters"]},
            "resources": [{"group": "example.com", "resource": "widgets", "writers": [
                {"serviceAccount": format!("{}/{}", CONTROLLER.0, CONTROLLER.1), "fields": ["replicas"]},
                {"serviceAccount": format!("{}/{}", SCALER.0, SCALER.1),
                 "fields": ["note", "observedGeneration", "summary.ready", "summary.total", "deep.x.p"],
                 "conditions": ["Ready"]},
            ]}],
        })
        .to_string()
    };
    let stored = json!({"note": "a", "observedGeneration": 2, "replicas": 1, "summary": {"ready": 1, "total": 3},
                        "deep": {"x": {"p": 1, "q": [1, 2.5]}}});
    let mut without_summary = stored.clone();
    without_summary.as_object_mut().unwrap().remove("summary");
    let cases = [
        ("summary dropped", stored.clone(), without_summary),
        ("status dropped", stored.clone(), Value::Null),
        ("status emptied", stored.clone(), json!({})),
        (
            "another's condition added where none is stored",
            stored.clone(),
            json!({"note": "a", "observedGeneration": 2, "replicas": 2, "summary": {"ready": 1, "total": 3},
                   "deep": {"x": {"p": 1, "q": [1, 2.5]}}, "conditions": [{"type": "Ready", "status": "True"}]}),
        ),
        (
            "an owned path below a list",
            json!({"note": "a", "deep": {"x": [1, 2]}}),
            json!({"note": "a", "deep": {"x": [3]}}),
        ),
        (
            "whole doubles",
            stored.clone(),
            json!({"note": "a", "observedGeneration": 2, "replicas": 2, "summary": {"ready": 1, "total": 3},
                   "deep": {"x": {"p": 1.0, "q": [1.0, 2.5]}}}),
        ),
    ];
    for mode in ["enforce", "trim"] {
        let doc = document(mode);
        let (server, dir) = guard_both(&engines, &doc, mode).await;
        wait_for_policies(&engines, mode).await;
        for (what, stored, written) in &cases {
            let (webhook, policies) = both(&engines, stored, written).await;
            if let Err(difference) = compare(mode, stored, &webhook, &policies) {
                panic!("{mode}, {what}: {difference}");
            }
            // Not decided alike by accident: both engines did decide.
            assert!(
                [200, 409].contains(&webhook.code),
                "{mode}, {what}: {} {:?}",
                webhook.code,
                webhook.body
            );
        }
        drop((server, dir));
        engines.webhook.unregister().await;
    }
    delete_policies(&engines.webhook.admin).await;
}

/// The real kubectl's status writes, as the scaler, through both engines:
/// `patch --subresource=status` (merge) and `apply --server-side
/// --subresource=status`, of its own field and of the controller's, in
/// enforce and in trim. Whether kubectl succeeds, and what is stored, must
/// be the same; the webhook's 409 earns kubectl's `--force-conflicts`
/// advice, the policy's 403 does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_writes_decide_alike_on_both_engines() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let engines = Engines::new().await;
    let kubeconfig = engines
        .webhook
        .cluster
        .service_account_kubeconfig(SCALER.0, SCALER.1)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let example = include_str!("../examples/ownership.yaml");
    for mode in ["enforce", "trim"] {
        let doc = example.replace("mode: enforce ", &format!("mode: {mode} "));
        let (server, server_dir) = guard_both(&engines, &doc, mode).await;
        wait_for_replicas_guarded(&engines, mode).await;
        let stored =
            json!({"observedGeneration": 1, "replicas": 1, "conditions": [{"type": "Ready", "status": "True"}]});
        for (what, own) in [("observedGeneration", false), ("replicas", true)] {
            for verb in ["patch", "apply"] {
                let mut outcomes = Vec::new();
                for s in [&engines.webhook, &engines.policies] {
                    let mut object = s.get(&s.admin, "case").await;
                    object["status"] = stored.clone();
                    assert_eq!(s.put_status(&s.admin, &object).await.code, 200);
                    let status = json!({what: 7});
                    let args: Vec<String> = match verb {
                        "patch" => [
                            "patch",
                            "widget",
                            "case",
                            "-n",
                            &s.namespace,
                            "--subresource=status",
                            "--type=merge",
                            "-p",
                        ]
                        .iter()
                        .map(|a| (*a).to_owned())
                        .chain([json!({"status": status}).to_string()])
                        .collect(),
                        _ => {
                            let manifest = dir.path().join(format!("{}.json", s.namespace));
                            let object = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                "metadata": {"name": "case", "namespace": s.namespace}, "status": status});
                            std::fs::write(&manifest, object.to_string()).unwrap();
                            [
                                "apply",
                                "--server-side",
                                "--force-conflicts",
                                "--subresource=status",
                                "--field-manager=scaler",
                                "-f",
                            ]
                            .iter()
                            .map(|a| (*a).to_owned())
                            .chain([manifest.display().to_string()])
                            .collect()
                        }
                    };
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let (succeeded, _, stderr) = support::kubectl::run(&kubeconfig, &args);
                    let after = s.get(&s.admin, "case").await["status"].clone();
                    outcomes.push((succeeded, stderr, after));
                }
                let ((webhook_ok, webhook_said, webhook_status), (policies_ok, policies_said, policies_status)) =
                    (&outcomes[0], &outcomes[1]);
                let case =
                    format!("{mode}, kubectl {verb} of {what}: webhook {webhook_said:?}, policies {policies_said:?}");
                assert_eq!(webhook_ok, policies_ok, "{case}");
                assert_eq!(webhook_status, policies_status, "{case}");
                // Only another writer's field is refused in enforce (and restored in trim).
                assert_eq!(*webhook_ok, own || mode == "trim", "{case}");
                if !own {
                    assert_eq!(webhook_status[what], json!(1), "{case}");
                }
                if !own && mode == "enforce" {
                    assert!(
                        webhook_said
                            .contains("statusguard: system:serviceaccount:platform:widget-scaler may not change"),
                        "{case}"
                    );
                    assert!(
                        policies_said
                            .contains("statusguard: system:serviceaccount:platform:widget-scaler may not change"),
                        "{case}"
                    );
                    assert!(
                        policies_said.contains("Forbidden") || policies_said.contains("forbidden"),
                        "{case}"
                    );
                }
            }
        }
        drop((server, server_dir));
        engines.webhook.unregister().await;
    }
    delete_policies(&engines.webhook.admin).await;
}

/// Waits until the policies of `mode` decide in the policies' namespace
/// under the example document: the controller's change of the scaler's
/// `replicas` is refused (enforce) or undone (trim).
async fn wait_for_replicas_guarded(engines: &Engines, mode: &str) {
    let s = &engines.policies;
    support::wait::retry_until(Duration::from_secs(30), "the policies take effect", || async {
        let answer = case(s, &s.controller, &json!({"replicas": 1}), &json!({"replicas": 2})).await;
        let in_force = match mode {
            "enforce" => answer.code == 403,
            _ => answer.code == 200 && status_of(&answer)["replicas"] == json!(1),
        };
        if in_force {
            Ok(())
        } else {
            Err(format!("{} {}", answer.code, answer.body))
        }
    })
    .await
}

/// statusguard's client-go status writer (tests/clients/statuswriter.sh).
fn statuswriter() -> std::path::PathBuf {
    support::printed_path("tests/clients/statuswriter.sh")
        .unwrap_or_else(|e| panic!("this test drives a client-go program, which could not be built: {e}"))
}

/// A client-go controller's write (RetryOnConflict around get and
/// UpdateStatus) through both engines: the webhook's 409 makes client-go
/// refetch and retry (each retry changes the field again, so all five are
/// refused), the policy's 403 ends the write at once. Its own field goes
/// through both at the first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_go_retries_only_the_webhooks_conflict() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let engines = Engines::new().await;
    let kubeconfig = engines
        .webhook
        .cluster
        .service_account_kubeconfig(SCALER.0, SCALER.1)
        .await;
    let doc = include_str!("../examples/ownership.yaml");
    let (server, server_dir) = guard_both(&engines, doc, "enforce").await;
    wait_for_replicas_guarded(&engines, "enforce").await;
    let stored = json!({"observedGeneration": 1, "replicas": 1});
    for (set, webhook_said, policies_said) in [
        (
            json!({"observedGeneration": 7}),
            "attempts=5 reason=Conflict",
            "attempts=1 reason=Forbidden",
        ),
        (
            json!({"replicas": 7}),
            "attempts=1 reason=Success",
            "attempts=1 reason=Success",
        ),
    ] {
        let mut stored_after = Vec::new();
        for (s, expected) in [(&engines.webhook, webhook_said), (&engines.policies, policies_said)] {
            let mut object = s.get(&s.admin, "case").await;
            object["status"] = stored.clone();
            assert_eq!(s.put_status(&s.admin, &object).await.code, 200);
            let output = std::process::Command::new(statuswriter())
                .args(["-namespace", &s.namespace, "-name", "case", "-status", &set.to_string()])
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&output.stdout);
            assert_eq!(
                said.trim(),
                expected,
                "{} setting {set}: {}",
                s.namespace,
                String::from_utf8_lossy(&output.stderr)
            );
            stored_after.push(s.get(&s.admin, "case").await["status"].clone());
        }
        assert_eq!(stored_after[0], stored_after[1], "setting {set}");
    }
    drop((server, server_dir));
    engines.webhook.unregister().await;
    delete_policies(&engines.webhook.admin).await;
}
