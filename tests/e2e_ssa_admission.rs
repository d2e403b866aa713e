//! What admission can and cannot do about server-side apply, on the real
//! kube-apiserver (issue 24's research). A scratch webhook of the test's own
//! (not statusguard) does what a trim would: it puts back the values a
//! violator's apply changed, and in some cases also rewrites
//! `metadata.managedFields`. The tests record what the API server stores.
//!
//! Findings, each asserted below:
//! - A mutating webhook's valid edit of `metadata.managedFields` on a status
//!   apply (forced or not) is stored as sent; the API server does not
//!   recompute ownership after mutating admission (it only resets
//!   managedFields that fail validation, with a warning).
//! - Restoring values alone leaves the violator as the manager of the
//!   restored fields: the real owner's next unforced apply of a new value
//!   fails with `Apply failed with N conflicts: conflicts with "violator"
//!   with subresource "status"`. With the ownership handed back as well,
//!   it succeeds: for a scalar and for a `listType=map` conditions entry.
//! - HTTPRoute `status.parents` is atomic: one manager owns the whole list.
//!   Whatever managedFields say, the next apply of either implementation
//!   replaces the whole list with its own entries.
//! - An entry restored into a list at `maxItems` makes the API server refuse
//!   the write as Invalid after admission; the stored object is unchanged.
//! - A validating webhook's 409 reaches the client with the webhook's code
//!   and reason and the message prefixed `admission webhook "<name>" denied
//!   the request: `.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::Request;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use support::cluster;
use support::gateway::{self, ENVOY, GatewayScenario, ISTIO};
use support::kubectl;
use support::scenario::{Scenario, Written, send};

/// What the scratch webhook does with one AdmissionRequest: the JSON Patch
/// operations of its answer (mutating), or the Status of its denial
/// (validating; None allows).
type Mutation = Box<dyn Fn(&Value) -> Vec<Value> + Send + Sync>;

#[derive(Clone)]
struct Scratch {
    mutation: Arc<Mutex<Option<Mutation>>>,
    denial: Arc<Mutex<Option<Value>>>,
    calls: Arc<AtomicUsize>,
}

async fn mutate(State(scratch): State<Scratch>, Json(review): Json<Value>) -> Json<Value> {
    scratch.calls.fetch_add(1, Ordering::SeqCst);
    let request = &review["request"];
    let ops = match scratch.mutation.lock().unwrap().as_ref() {
        Some(mutation) => mutation(request),
        None => Vec::new(),
    };
    let mut response = json!({"uid": request["uid"], "allowed": true});
    if !ops.is_empty() {
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&ops).unwrap()));
    }
    Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

async fn validate(State(scratch): State<Scratch>, Json(review): Json<Value>) -> Json<Value> {
    scratch.calls.fetch_add(1, Ordering::SeqCst);
    let request = &review["request"];
    let manager = request["options"]["fieldManager"].as_str().unwrap_or_default();
    let response = match scratch.denial.lock().unwrap().clone() {
        Some(status) if manager == "violator" => json!({"uid": request["uid"], "allowed": false, "status": status}),
        _ => json!({"uid": request["uid"], "allowed": true}),
    };
    Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

/// The scratch webhook on a loopback TLS port.
struct ScratchServer {
    port: u16,
    ca_pem: String,
    scratch: Scratch,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScratchServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScratchServer {
    async fn start() -> Self {
        let certs = statusguard::cluster::certs::policy::generate_certificates(&[]).unwrap();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(certs.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let scratch = Scratch {
            mutation: Arc::default(),
            denial: Arc::default(),
            calls: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/mutate", post(mutate))
            .route("/validate", post(validate))
            .with_state(scratch.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        let service = hyper_util::service::TowerToHyperService::new(app);
                        let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                });
            }
        });
        Self {
            port,
            ca_pem: certs.ca_pem,
            scratch,
            task,
        }
    }

    /// Registers both endpoints for `resource` of `group` (status updates in
    /// `namespace`) and waits until `probe` (a dry-run write) reaches them.
    async fn register<F, Fut>(&self, admin: &Client, group: &str, resource: &str, namespace: &str, probe: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let webhook = |path: &str| {
            json!({
                "name": format!("{path}.scratch.statusguard.dev"),
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{}/{path}", self.port),
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem),
                },
                "rules": [{"apiGroups": [group], "apiVersions": ["*"], "resources": [format!("{resource}/status")],
                           "operations": ["UPDATE"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"statusguard-test": namespace}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            })
        };
        let name = format!("scratch-{namespace}");
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
        cluster::ensure_json(
            &mutating,
            json!({"metadata": {"name": name}, "webhooks": [webhook("mutate")]}),
        )
        .await;
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
        cluster::ensure_json(
            &validating,
            json!({"metadata": {"name": name}, "webhooks": [webhook("validate")]}),
        )
        .await;
        let calls = self.scratch.calls.clone();
        support::wait::retry_until(
            Duration::from_secs(30),
            "the API server calls the scratch webhook",
            || {
                let before = calls.load(Ordering::SeqCst);
                let calls = calls.clone();
                let attempt = probe();
                async move {
                    attempt.await;
                    // both endpoints answered
                    if calls.load(Ordering::SeqCst) >= before + 2 {
                        Ok(())
                    } else {
                        Err("not yet called")
                    }
                }
            },
        )
        .await;
    }
}

/// A server-side apply of a Widget's `status` to `base/name` as field manager `manager`.
async fn apply(client: &Client, base: &str, name: &str, manager: &str, status: Value, force: bool) -> Written {
    let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "status": status});
    let mut params = PatchParams::apply(manager);
    params.force = force;
    let request = Request::new(base)
        .patch_subresource("status", name, &params, &Patch::Apply(body))
        .unwrap();
    send(client, request).await
}

/// A dry-run status update of `object` as it is (under `base`), which
/// reaches the scratch webhook once the API server calls it.
async fn dry_run_status(client: &Client, base: &str, object: &Value) {
    let name = object["metadata"]["name"].as_str().unwrap();
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let request = Request::new(base)
        .replace_subresource("status", name, &params, serde_json::to_vec(object).unwrap())
        .unwrap();
    let _ = send(client, request).await;
}

/// The status-subresource managedFields entry of `manager` in `object`.
fn fields_of(object: &Value, manager: &str) -> Value {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["manager"] == manager && e["subresource"] == "status")
        .map(|e| e["fieldsV1"].clone())
        .unwrap_or(Value::Null)
}

fn condition(status: &str, reason: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": "",
           "lastTransitionTime": "2026-12-01T10:00:00Z"})
}

/// The trim of a violator's Widget apply: `replicas` and `conditions` back
/// to the stored values; with `hand_back`, also the ownership of both back
/// to the manager "owner" (its entry as stored before the write; the
/// violator's entry without them).
fn restore_widget(hand_back: bool) -> Mutation {
    Box::new(move |request: &Value| {
        if request["options"]["fieldManager"] != "violator" {
            return Vec::new();
        }
        let old = &request["oldObject"];
        let mut ops = vec![
            json!({"op": "replace", "path": "/status/replicas", "value": old["status"]["replicas"]}),
            json!({"op": "replace", "path": "/status/conditions", "value": old["status"]["conditions"]}),
        ];
        if hand_back {
            let mut managed = request["object"]["metadata"]["managedFields"].clone();
            let old_owner = old["metadata"]["managedFields"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["manager"] == "owner" && e["subresource"] == "status")
                .cloned()
                .unwrap();
            let entries = managed.as_array_mut().unwrap();
            // A forced apply that takes every field of a manager drops its entry.
            entries.retain(|e| !(e["manager"] == "owner" && e["subresource"] == "status"));
            entries.push(old_owner);
            for entry in entries.iter_mut() {
                if entry["subresource"] == "status" && entry["manager"] == "violator" {
                    let status = &mut entry["fieldsV1"]["f:status"];
                    if let Some(status) = status.as_object_mut() {
                        status.remove("f:replicas");
                        if let Some(conditions) = status.get_mut("f:conditions").and_then(Value::as_object_mut) {
                            conditions.remove("k:{\"type\":\"Ready\"}");
                        }
                    }
                }
            }
            ops.push(json!({"op": "replace", "path": "/metadata/managedFields", "value": managed}));
        }
        ops
    })
}

#[tokio::test]
async fn managed_fields_after_a_trimmed_forced_status_apply_of_a_scalar_and_a_map_list() {
    let s = Scenario::new("ssa-widget").await;
    let server = ScratchServer::start().await;
    let base = format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace);
    s.create_widget("probe", json!({})).await;
    server
        .register(&s.admin, "example.com", "widgets", &s.namespace, || async {
            dry_run_status(&s.admin, &base, &s.get(&s.admin, "probe").await).await;
        })
        .await;
    let widget = |name: &str, manager: &str, replicas: i64, ready: Value, force: bool| {
        let (admin, base, name, manager) = (s.admin.clone(), base.clone(), name.to_owned(), manager.to_owned());
        async move {
            apply(
                &admin,
                &base,
                &name,
                &manager,
                json!({"replicas": replicas, "conditions": [ready]}),
                force,
            )
            .await
        }
    };

    for (hand_back, name) in [(false, "values-only"), (true, "hand-back")] {
        s.create_widget(name, json!({})).await;
        let owner = widget(name, "owner", 3, condition("True", "Reconciled"), false).await;
        assert_eq!(owner.code, 200, "{:?}", owner.body);

        *server.scratch.mutation.lock().unwrap() = Some(restore_widget(hand_back));
        for force in [false, true] {
            let violator = widget(name, "violator", 5, condition("False", "Broken"), force).await;
            if !force {
                // Without force the API server refuses before admission.
                assert_eq!(violator.code, 409, "{:?}", violator.body);
                assert!(
                    violator.message().starts_with("Apply failed with ")
                        && violator
                            .message()
                            .contains("with \"owner\" with subresource \"status\""),
                    "{}",
                    violator.message()
                );
                continue;
            }
            assert_eq!(violator.code, 200, "{:?}", violator.body);
            let stored = &violator.body;
            assert_eq!(stored["status"]["replicas"], 3, "the trim restored the value");
            assert_eq!(stored["status"]["conditions"][0]["reason"], "Reconciled");
            eprintln!(
                "{name}: after the trimmed forced apply: owner {} / violator {}",
                fields_of(stored, "owner"),
                fields_of(stored, "violator")
            );
            if hand_back {
                // Stored exactly as the webhook sent it.
                assert!(fields_of(stored, "owner")["f:status"]["f:replicas"].is_object());
                assert!(fields_of(stored, "violator")["f:status"].get("f:replicas").is_none());
            } else {
                assert!(fields_of(stored, "violator")["f:status"]["f:replicas"].is_object());
                assert!(fields_of(stored, "owner")["f:status"].get("f:replicas").is_none());
            }
        }
        *server.scratch.mutation.lock().unwrap() = None;

        let next = widget(name, "owner", 4, condition("True", "Scaled"), false).await;
        eprintln!(
            "{name}: the owner's next unforced apply: {} {}",
            next.code,
            next.message()
        );
        if hand_back {
            assert_eq!(next.code, 200, "{:?}", next.body);
        } else {
            assert_eq!(next.code, 409, "{:?}", next.body);
            assert!(
                next.message().starts_with("Apply failed with ")
                    && next.message().contains("with \"violator\" with subresource \"status\""),
                "{}",
                next.message()
            );
        }
    }
    unregister(&s.admin, &s.namespace).await;
}

async fn unregister(admin: &Client, namespace: &str) {
    let name = format!("scratch-{namespace}");
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let _ = mutating.delete(&name, &Default::default()).await;
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let _ = validating.delete(&name, &Default::default()).await;
}

/// The trim of a parents write: the entries of the other implementation,
/// as stored, appended where the write dropped them; with `hand_back`, the
/// managedFields as stored before the write.
fn restore_parents(writer: &'static str, hand_back: bool) -> Mutation {
    Box::new(move |request: &Value| {
        let Some(new) = request["object"]["status"]["parents"].as_array() else {
            return Vec::new();
        };
        let mut ops = Vec::new();
        let mut parents = new.clone();
        for entry in request["oldObject"]["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if entry["controllerName"] != writer && !new.contains(entry) {
                parents.push(entry.clone());
            }
        }
        if parents.len() != new.len() {
            ops.push(json!({"op": "replace", "path": "/status/parents", "value": parents}));
            if hand_back {
                ops.push(json!({"op": "replace", "path": "/metadata/managedFields",
                                "value": request["oldObject"]["metadata"]["managedFields"]}));
            }
        }
        ops
    })
}

async fn route_scratch(g: &GatewayScenario) -> ScratchServer {
    let server = ScratchServer::start().await;
    g.create_route("probe", json!([])).await;
    server
        .register(&g.admin, gateway::GROUP, "httproutes", &g.namespace, || async {
            let base = format!("/apis/{}/v1/namespaces/{}/httproutes", gateway::GROUP, g.namespace);
            dry_run_status(&g.admin, &base, &g.get(&g.admin, "probe").await).await;
        })
        .await;
    server
}

#[tokio::test]
async fn an_atomic_parents_list_has_one_manager_whatever_admission_restores() {
    let g = GatewayScenario::new("ssa-route").await;
    let server = route_scratch(&g).await;
    for (hand_back, name) in [(false, "values-only"), (true, "hand-back")] {
        g.create_route(name, json!([])).await;
        let istio_entry = gateway::parent(ISTIO, ISTIO.gateway_class, &[("Accepted", "True")]);
        let first = g
            .apply_status(&g.istio, "istiod", name, json!({"parents": [istio_entry]}), true)
            .await;
        assert_eq!(first.code, 200, "{:?}", first.body);

        // kubectl-style: envoy applies the whole list with force, holding only its entry.
        *server.scratch.mutation.lock().unwrap() = Some(restore_parents(ENVOY.controller_name, hand_back));
        let envoy_entry = gateway::parent(ENVOY, ENVOY.gateway_class, &[("Accepted", "True")]);
        let forced = g
            .apply_status(&g.envoy, "envoy-gateway", name, json!({"parents": [envoy_entry]}), true)
            .await;
        assert_eq!(forced.code, 200, "{:?}", forced.body);
        assert_eq!(
            gateway::controllers(&forced.body),
            [ENVOY.controller_name, ISTIO.controller_name],
            "the trim put istio's entry back"
        );
        eprintln!(
            "{name}: after the trimmed forced apply: istiod {} / envoy-gateway {}",
            fields_of(&forced.body, "istiod"),
            fields_of(&forced.body, "envoy-gateway")
        );
        *server.scratch.mutation.lock().unwrap() = None;

        // istio updates its entry by apply, unforced.
        let updated = gateway::parent(ISTIO, ISTIO.gateway_class, &[("Accepted", "False")]);
        let next = g
            .apply_status(&g.istio, "istiod", name, json!({"parents": [updated]}), false)
            .await;
        eprintln!("{name}: istiod's next unforced apply: {} {}", next.code, next.message());
        if hand_back {
            // Ownership handed back: the apply passes, and replaces the whole
            // atomic list, dropping envoy's entry.
            assert_eq!(next.code, 200, "{:?}", next.body);
            assert_eq!(gateway::controllers(&next.body), [ISTIO.controller_name]);
        } else {
            assert_eq!(next.code, 409, "{:?}", next.body);
            assert_eq!(
                next.message(),
                "Apply failed with 1 conflict: conflict with \"envoy-gateway\" with subresource \"status\": .status.parents"
            );
        }
    }
    unregister(&g.admin, &g.namespace).await;
}

#[tokio::test]
async fn an_entry_restored_into_a_full_list_is_refused_as_invalid_after_admission() {
    let g = GatewayScenario::new("ssa-max-items").await;
    let server = route_scratch(&g).await;
    // 32 parents, the CRD's maxItems: 16 of each implementation.
    let full: Vec<Value> = (0..32)
        .map(|i| {
            let implementation = if i % 2 == 0 { ENVOY } else { ISTIO };
            gateway::parent(implementation, &format!("gw-{i}"), &[("Accepted", "True")])
        })
        .collect();
    g.create_route("full", json!(full)).await;
    *server.scratch.mutation.lock().unwrap() = Some(restore_parents(ENVOY.controller_name, false));

    // envoy replaces one of istio's entries with a new one of its own: still 32.
    let mut object = g.get(&g.envoy, "full").await;
    object["status"]["parents"][1] = gateway::parent(ENVOY, "gw-new", &[("Accepted", "True")]);
    let written = g.put_status(&g.envoy, &object).await;
    eprintln!("full list: {} {}", written.code, written.body);
    assert_eq!(written.code, 422, "{:?}", written.body);
    assert_eq!(written.body["reason"], "Invalid");
    assert!(
        written
            .message()
            .contains("status.parents: Too many: 33: must have at most 32 items"),
        "{}",
        written.message()
    );
    assert_eq!(gateway::controllers(&g.get(&g.admin, "full").await).len(), 32);
    assert_eq!(
        g.get(&g.admin, "full").await["status"]["parents"],
        json!(full),
        "nothing stored"
    );
    unregister(&g.admin, &g.namespace).await;
}

#[tokio::test]
async fn a_validating_webhooks_409_reaches_the_client_with_its_reason_and_a_prefix() {
    let s = Scenario::new("ssa-denial").await;
    let server = ScratchServer::start().await;
    let base = format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace);
    s.create_widget("w", json!({"replicas": 1})).await;
    let admin = s.admin.clone();
    let probe_base = base.clone();
    server
        .register(&s.admin, "example.com", "widgets", &s.namespace, || {
            let (admin, base) = (admin.clone(), probe_base.clone());
            async move {
                let _ = apply(&admin, &base, "w", "probe", json!({}), true).await;
            }
        })
        .await;
    for reason in ["Conflict", "Forbidden"] {
        *server.scratch.denial.lock().unwrap() =
            Some(json!({"code": 409, "reason": reason, "message": "status.replicas (owned by someone)"}));
        let denied = apply(&s.admin, &base, "w", "violator", json!({"replicas": 2}), true).await;
        eprintln!("denied with reason {reason}: {} {}", denied.code, denied.body);
        assert_eq!(denied.code, 409);
        assert_eq!(denied.body["reason"], reason);
        assert_eq!(
            denied.message(),
            "admission webhook \"validate.scratch.statusguard.dev\" denied the request: status.replicas (owned by someone)"
        );
    }
    unregister(&s.admin, &s.namespace).await;
}

/// statusguard itself (examples/ownership.yaml) against a forced status
/// apply by the scaler of the controller's field and condition: trim hands
/// the ownership back, so that the controller's next unforced apply
/// succeeds; enforce's 409 says that `--force-conflicts` does not override
/// ownership.
#[tokio::test]
async fn statusguard_after_a_forced_apply_of_another_writers_items() {
    for mode in ["trim", "enforce"] {
        let s = Scenario::new(&format!("ssa-statusguard-{mode}")).await;
        let dir = tempfile::tempdir().unwrap();
        let document = dir.path().join("ownership.yaml");
        std::fs::write(
            &document,
            include_str!("../examples/ownership.yaml").replace("mode: enforce", &format!("mode: {mode}")),
        )
        .unwrap();
        let (_server, _certs) = s
            .guarded_by(statusguard::rules::RulesSource::File(document), mode == "trim")
            .await;
        let base = format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace);
        s.create_widget("w", json!({})).await;
        let write = |who: &Client, manager: &str, generation: i64, ready: Value, force: bool| {
            let (who, base, manager) = (who.clone(), base.clone(), manager.to_owned());
            async move {
                apply(
                    &who,
                    &base,
                    "w",
                    &manager,
                    json!({"observedGeneration": generation, "conditions": [ready]}),
                    force,
                )
                .await
            }
        };
        let first = write(
            &s.controller,
            "widget-controller",
            1,
            condition("True", "Reconciled"),
            false,
        )
        .await;
        assert_eq!(first.code, 200, "{mode}: {:?}", first.body);

        let forced = write(&s.scaler, "widget-scaler", 9, condition("False", "Broken"), true).await;
        if mode == "enforce" {
            assert_eq!(forced.code, 409, "{:?}", forced.body);
            assert!(
                forced.message().contains("--force-conflicts"),
                "the 409 says that --force-conflicts does not override ownership: {}",
                forced.message()
            );
            continue;
        }
        assert_eq!(forced.code, 200, "{:?}", forced.body);
        assert_eq!(forced.body["status"]["observedGeneration"], 1);
        let scaler = fields_of(&forced.body, "widget-scaler");
        assert!(
            scaler["f:status"].get("f:observedGeneration").is_none()
                && scaler["f:status"]["f:conditions"]
                    .get("k:{\"type\":\"Ready\"}")
                    .is_none(),
            "the scaler does not manage what trim restored: {scaler}"
        );
        let next = write(
            &s.controller,
            "widget-controller",
            2,
            condition("True", "Scaled"),
            false,
        )
        .await;
        assert_eq!(next.code, 200, "the owner's unforced apply: {:?}", next.body);
        s.unregister().await;
    }
}

/// What kubectl prints for a webhook's 409 on `apply --server-side
/// --force-conflicts`: the API server's message, and kubectl's own advice
/// when the reason is Conflict (k8s.io/kubectl pkg/cmd/apply: it appends
/// its text whenever `errors.IsConflict`, i.e. reason Conflict, or an
/// unknown reason with code 409). kubectl is built by tests/clients/kubectl.sh.
// kubectl blocks its thread while the scratch webhook answers on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_appends_its_force_conflicts_advice_to_a_webhooks_409_conflict() {
    let s = Scenario::new("ssa-kubectl").await;
    let server = ScratchServer::start().await;
    let base = format!("/apis/example.com/v1/namespaces/{}/widgets", s.namespace);
    s.create_widget("w", json!({"replicas": 1})).await;
    server
        .register(&s.admin, "example.com", "widgets", &s.namespace, || async {
            let _ = apply(&s.admin, &base, "w", "probe", json!({}), true).await;
        })
        .await;
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("w.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w, namespace: {}}}\nstatus: {{replicas: 2}}\n",
            s.namespace
        ),
    )
    .unwrap();
    for (reason, advice) in [("Conflict", true), ("Forbidden", false)] {
        *server.scratch.denial.lock().unwrap() =
            Some(json!({"code": 409, "reason": reason, "message": "status.replicas (owned by someone)"}));
        let (succeeded, _, stderr) = kubectl::run(
            &s.cluster.kubeconfig,
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--subresource=status",
                "--field-manager=violator",
                "-f",
                manifest.to_str().unwrap(),
            ],
        );
        eprintln!("kubectl, reason {reason}:\n{stderr}");
        assert!(!succeeded);
        assert!(
            stderr.contains("admission webhook \"validate.scratch.statusguard.dev\" denied the request: status.replicas (owned by someone)"),
            "{stderr}"
        );
        assert_eq!(stderr.contains("re-run the apply"), advice, "{stderr}");
    }
    unregister(&s.admin, &s.namespace).await;
}

/// The real kubectl's server-side apply against statusguard (examples/
/// ownership.yaml): the scaler force-applies the controller's
/// observedGeneration and Ready condition. In trim, the values and their
/// management go back to the controller, whose next apply without
/// `--force-conflicts` succeeds; in enforce, kubectl shows statusguard's 409
/// saying that `--force-conflicts` does not override ownership, whatever
/// advice kubectl adds under it.
// kubectl blocks its thread while statusguard answers on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_against_statusguard() {
    use support::scenario::{CONTROLLER, SCALER};
    for mode in ["trim", "enforce"] {
        let s = Scenario::new(&format!("ssa-kubectl-{mode}")).await;
        let dir = tempfile::tempdir().unwrap();
        let document = dir.path().join("ownership.yaml");
        std::fs::write(
            &document,
            include_str!("../examples/ownership.yaml").replace("mode: enforce", &format!("mode: {mode}")),
        )
        .unwrap();
        let (_server, _certs) = s
            .guarded_by(statusguard::rules::RulesSource::File(document), mode == "trim")
            .await;
        s.create_widget("w", json!({})).await;
        let controller = s.cluster.service_account_kubeconfig(CONTROLLER.0, CONTROLLER.1).await;
        let scaler = s.cluster.service_account_kubeconfig(SCALER.0, SCALER.1).await;
        let apply = |kubeconfig: std::path::PathBuf,
                     manager: &'static str,
                     generation: i64,
                     ready: &str,
                     force: bool| {
            let manifest = dir.path().join(format!("{manager}-{generation}.yaml"));
            std::fs::write(
                &manifest,
                format!(
                    "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w, namespace: {}}}\n\
                     status:\n  observedGeneration: {generation}\n  conditions:\n  - {{type: Ready, status: \"{ready}\", \
                     reason: R{generation}, message: \"\", lastTransitionTime: \"2026-12-03T10:00:00Z\"}}\n",
                    s.namespace
                ),
            )
            .unwrap();
            tokio::task::spawn_blocking(move || {
                let mut args = vec!["apply", "--server-side", "--subresource=status", "-f"];
                let manifest = manifest.to_string_lossy().into_owned();
                let field_manager = format!("--field-manager={manager}");
                args.extend([manifest.as_str(), field_manager.as_str()]);
                if force {
                    args.push("--force-conflicts");
                }
                kubectl::run(&kubeconfig, &args)
            })
        };
        let (ok, _, stderr) = apply(controller.clone(), "widget-controller", 1, "True", false)
            .await
            .unwrap();
        assert!(ok, "{mode}: the controller's first apply: {stderr}");

        let (ok, _, stderr) = apply(scaler, "widget-scaler", 9, "False", true).await.unwrap();
        eprintln!("{mode}: the scaler's forced apply: ok={ok}\n{stderr}");
        let stored = s.get(&s.admin, "w").await;
        if mode == "enforce" {
            assert!(!ok);
            assert!(
                stderr.contains("may not change status fields owned by other writers")
                    && stderr.contains("--force-conflicts does not override it"),
                "{stderr}"
            );
            assert_eq!(stored["status"]["observedGeneration"], 1);
            continue;
        }
        assert!(ok, "{stderr}");
        assert!(
            stderr.contains("statusguard restored"),
            "kubectl shows the trim's warnings: {stderr}"
        );
        assert_eq!(stored["status"]["observedGeneration"], 1);
        assert_eq!(stored["status"]["conditions"][0]["status"], "True");
        let scaler_fields = fields_of(&stored, "widget-scaler");
        assert!(
            scaler_fields
                .get("f:status")
                .and_then(|f| f.get("f:observedGeneration"))
                .is_none(),
            "the scaler does not manage what trim restored: {scaler_fields}"
        );

        let (ok, _, stderr) = apply(controller, "widget-controller", 2, "True", false).await.unwrap();
        assert!(ok, "the controller's next apply, without --force-conflicts: {stderr}");
        let stored = s.get(&s.admin, "w").await;
        assert_eq!(stored["status"]["observedGeneration"], 2);
        s.unregister().await;
    }
}
