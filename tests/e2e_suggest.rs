//! Issue 16: adopting statusguard in a running cluster, the whole loop.
//! The chart is installed with a document that only observes Widgets (no
//! writers, audit mode) and the server runs as its pod would. Two controller
//! identities and a third that no document lists write Widgets' status, each
//! under its own field manager; the scaler's stale full update rolls the
//! controller's observedGeneration back on one Widget, so that field is
//! contested. Then:
//! - `statusguard suggest` drafts a document that `check` accepts, names the
//!   contested field, and, with the server's observed writes, uses the
//!   ServiceAccounts (without them, it names the field managers);
//! - that document, applied in enforce mode, blocks the stale retry;
//! - the blocked retry is a Warning Event on the Widget, found as `kubectl
//!   describe` finds it; a retry storm is one Event whose series counts it;
//!   a dry run makes none.
//!
//! One test in its own binary: it installs a release with cluster-wide webhooks.

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::chart::Release;
use support::cluster;
use support::scenario::Scenario;
use support::webhook::{BinaryServer, free_port};

const RELEASE: &str = "adopt";
const NAMESPACE: &str = "statusguard-adopt";
const AUDITOR: (&str, &str) = ("platform", "widget-auditor");

/// A server-side apply of `name`'s status by `who`, as field manager
/// `manager` (conditions merge by type, as controllers apply them).
async fn patch(s: &Scenario, who: &Client, manager: &str, name: &str, status: Value) -> Result<(), kube::Error> {
    let params = PatchParams::apply(manager).force();
    let object =
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "status": status});
    cluster::widgets(who, &s.namespace)
        .patch_status(name, &params, &Patch::Apply(object))
        .await
        .map(drop)
}

/// The stale full update: `stale` put back as `who` with a fresh resourceVersion.
async fn stale_put(s: &Scenario, who: &Client, manager: &str, stale: &Value, dry_run: bool) -> Result<(), kube::Error> {
    let api = cluster::widgets(who, &s.namespace);
    let name = stale["metadata"]["name"].as_str().unwrap().to_owned();
    let latest = api.get(&name).await?;
    let mut retry = stale.clone();
    retry["metadata"]["resourceVersion"] = json!(latest.metadata.resource_version);
    let params = PostParams {
        field_manager: Some(manager.to_owned()),
        dry_run,
    };
    let retry: kube::api::DynamicObject = serde_json::from_value(retry).unwrap();
    api.replace_status(&name, &params, &retry).await.map(drop)
}

fn suggest(kubeconfig: &std::path::Path, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_statusguard"))
        .args(["suggest", "widgets.example.com", "-n", "e2e-suggest"])
        .args(extra)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    said
}

/// The Events of `reason` regarding `name`.
async fn events_for(s: &Scenario, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(s.admin.clone(), &s.namespace);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

#[tokio::test]
async fn suggest_observe_enforce_and_events_close_the_adoption_loop() {
    let s = Scenario::new("e2e-suggest").await;
    cluster::service_account(&s.admin, AUDITOR.0, AUDITOR.1).await;
    cluster::grant_widget_writers(&s.admin, &[AUDITOR]).await;
    let auditor = s.cluster.service_account_client(AUDITOR.0, AUDITOR.1).await;

    // Observe only: Widgets named, nobody owning anything, audit mode.
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let observe_only = "ownership:\n  apiVersion: statusguard.dev/v1alpha1\n  kind: StatusOwnership\n  mode: audit\n  resources:\n    - {group: example.com, resource: widgets}\n";
    let values =
        |ownership: &str| format!("{ownership}webhook:\n  url: https://127.0.0.1:{port}\nevents:\n  interval: 500ms\n");
    let release = Release::new(home.path(), RELEASE, NAMESPACE, &s.cluster.kubeconfig);
    release.install(&values(observe_only));
    let args = release.server_args(home.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = s
        .cluster
        .service_account_kubeconfig(NAMESPACE, "adopt-statusguard")
        .await;
    let server = BinaryServer::start_on(port, home.path(), &args, &[("KUBECONFIG", &kubeconfig)]).await;
    server.wait_ready().await;
    s.wait_until_called(&["endpoint=\"validate\""], || server.metrics())
        .await;

    // The cluster as it is: three Widgets and three writers.
    for name in ["w1", "w2", "w3"] {
        s.create_widget(name, json!({})).await;
    }
    let mut w3_stale = Value::Null;
    for round in 1..=3 {
        for name in ["w1", "w2", "w3"] {
            let ready = json!([{"type": "Ready", "status": "True"}]);
            patch(
                &s,
                &s.controller,
                "widget-controller",
                name,
                json!({"observedGeneration": round, "conditions": ready}),
            )
            .await
            .unwrap();
            let scaled = json!([{"type": "Scaled", "status": "True"}]);
            patch(
                &s,
                &s.scaler,
                "widget-scaler",
                name,
                json!({"replicas": round, "conditions": scaled}),
            )
            .await
            .unwrap();
        }
        if round == 1 {
            w3_stale = s.get(&s.scaler, "w3").await;
        }
    }
    patch(&s, &auditor, "widget-auditor", "w2", json!({"note": "checked"}))
        .await
        .unwrap();
    // The bug: the scaler's stale copy of w3 put back. Audit mode stores it
    // (with a warning): observedGeneration is rolled back, and its field
    // manager is now the scaler's on w3.
    let mut stale = w3_stale.clone();
    stale["status"]["replicas"] = json!(9);
    stale_put(&s, &s.scaler, "widget-scaler", &stale, false).await.unwrap();
    assert_eq!(
        s.get(&s.admin, "w3").await["status"]["observedGeneration"],
        1,
        "rolled back from 3"
    );

    // suggest, from managedFields alone: the managers, for a human to map.
    let admin_kubeconfig = s.cluster.kubeconfig.clone();
    let draft = suggest(&admin_kubeconfig, &[]);
    assert!(
        draft.contains("# field manager \"widget-controller\": no observed identity"),
        "{draft}"
    );
    assert!(
        draft.contains("#   status.observedGeneration (drafted for widget-controller):"),
        "{draft}"
    );

    // With the webhook's observed writes: the ServiceAccounts.
    let observed = format!("http://127.0.0.1:{}/observed", server.admin);
    let draft = suggest(&admin_kubeconfig, &["--observed", &observed]);
    for expected in [
        "      - serviceAccount: platform/widget-controller  # field manager \"widget-controller\"\n        fields: [observedGeneration]  # contested: observedGeneration\n        conditions: [Ready]\n",
        "      - serviceAccount: platform/widget-scaler  # field manager \"widget-scaler\"\n        fields: [replicas]\n        conditions: [Scaled]\n",
        "      - serviceAccount: platform/widget-auditor  # field manager \"widget-auditor\"\n        fields: [note]\n",
        "#   status.observedGeneration (drafted for system:serviceaccount:platform:widget-controller):\n#     system:serviceaccount:platform:widget-controller: 2 object(s), e.g. e2e-suggest/w1, e2e-suggest/w2\n#     system:serviceaccount:platform:widget-scaler: 1 object(s), e.g. e2e-suggest/w3\n",
    ] {
        assert!(draft.contains(expected), "{expected}\nnot in\n{draft}");
    }
    let file = home.path().join("draft.yaml");
    std::fs::write(&file, &draft).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_statusguard"))
        .arg("check")
        .arg(&file)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));

    // The draft, in enforce mode, through helm: the stale retry is blocked.
    let enforced = draft.replace("\nmode: audit\n", "\nmode: enforce\n");
    let indented: String = enforced.lines().map(|l| format!("  {l}\n")).collect();
    release.upgrade(&values(&format!("ownership:\n{indented}")));
    let w1_stale = s.get(&s.scaler, "w1").await;
    patch(
        &s,
        &s.controller,
        "widget-controller",
        "w1",
        json!({"observedGeneration": 10}),
    )
    .await
    .unwrap();
    let denial = support::wait::retry_until(Duration::from_secs(30), "the stale retry is denied", || async {
        match stale_put(&s, &s.scaler, "widget-scaler", &w1_stale, false).await {
            Err(kube::Error::Api(e)) if e.message.contains("denied the request") => Ok(e.message),
            other => {
                // Stored while the old document was in force: write it back.
                let _ = patch(
                    &s,
                    &s.controller,
                    "widget-controller",
                    "w1",
                    json!({"observedGeneration": 10}),
                )
                .await;
                Err(format!("{other:?}"))
            }
        }
    })
    .await;
    assert!(denial.contains("status.observedGeneration"), "{denial}");
    assert_eq!(s.get(&s.admin, "w1").await["status"]["observedGeneration"], 10);

    // The Event, where `kubectl describe widget w1` looks: core/v1 Events of
    // the object's uid.
    let uid = s.get(&s.admin, "w1").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let core: Api<CoreEvent> = Api::namespaced(s.admin.clone(), &s.namespace);
    let described = support::wait::retry_until(Duration::from_secs(15), "an Event on w1", || async {
        let selector = format!("involvedObject.name=w1,involvedObject.uid={uid}");
        let found = core.list(&ListParams::default().fields(&selector)).await.unwrap().items;
        match found
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("StatusRollbackDenied"))
        {
            Some(event) => Ok(event),
            None => Err("none yet"),
        }
    })
    .await;
    assert_eq!(described.type_.as_deref(), Some("Warning"));
    let message = described.message.unwrap_or_default();
    assert!(
        message.contains("status write by system:serviceaccount:platform:widget-scaler denied")
            && message
                .contains("status.observedGeneration (owned by system:serviceaccount:platform:widget-controller)"),
        "{message}"
    );
    let event = &events_for(&s, "w1", "StatusRollbackDenied").await[0];
    let related = event.related.as_ref().expect("the writer is the related object");
    assert_eq!(
        (
            related.kind.as_deref(),
            related.namespace.as_deref(),
            related.name.as_deref()
        ),
        (Some("ServiceAccount"), Some("platform"), Some("widget-scaler"))
    );

    // A dry run of the same retry is denied, and makes no Event.
    let w2_stale = s.get(&s.scaler, "w2").await;
    patch(
        &s,
        &s.controller,
        "widget-controller",
        "w2",
        json!({"observedGeneration": 20}),
    )
    .await
    .unwrap();
    let dry = stale_put(&s, &s.scaler, "widget-scaler", &w2_stale, true).await;
    assert!(
        matches!(&dry, Err(kube::Error::Api(e)) if e.message.contains("denied the request")),
        "{dry:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        events_for(&s, "w2", "StatusRollbackDenied").await.is_empty(),
        "a dry run made an Event"
    );

    // A retry storm: one Event, its series counting the repeats.
    for _ in 0..30 {
        let retry = stale_put(&s, &s.scaler, "widget-scaler", &w2_stale, false).await;
        assert!(
            matches!(&retry, Err(kube::Error::Api(e)) if e.code == 409 || e.code == 400 || e.message.contains("denied")),
            "{retry:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let storm = support::wait::retry_until(Duration::from_secs(10), "the storm's Event series", || async {
        let events = events_for(&s, "w2", "StatusRollbackDenied").await;
        match events.first().and_then(|e| e.series.as_ref()) {
            Some(series) if series.count >= 2 => Ok(events),
            _ => Err(events.len()),
        }
    })
    .await;
    assert_eq!(storm.len(), 1, "one Event for the storm: {storm:?}");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("statusguard_events_total{reason=\"StatusRollbackDenied\",result=\"limited\"}"),
        "repeats within the interval were not sent: {metrics}"
    );
}

/// Issue 24: Gateway API's HTTPRoute, whose `status.parents` is atomic.
/// Two implementations each add and update their own entry with a full
/// UpdateStatus, as controller-runtime does. managedFields give the list
/// whole to the last writer, and suggest says it cannot tell who writes
/// which entry; with the observed writes of a webhook that only watches
/// routes, it drafts `lists:` keyed by controllerName and each
/// implementation's ServiceAccount with its own entries, and `check`
/// accepts the draft.
#[tokio::test]
async fn suggest_drafts_keyed_entries_of_gateway_routes_from_observed_writes() {
    use statusguard::ownership::Ownership;
    use statusguard::rules::RulesSource;
    use support::gateway::{ENVOY, GatewayScenario, ISTIO, parent};
    use support::webhook::{RunningServer, config, files, write_pair};

    let g = GatewayScenario::new("e2e-suggest-gateway").await;
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let rules = dir.path().join("watch-routes.yaml");
    std::fs::write(
        &rules,
        "apiVersion: statusguard.dev/v1alpha1\nkind: StatusOwnership\nmode: audit\nresources:\n  - {group: gateway.networking.k8s.io, resource: httproutes}\n",
    )
    .unwrap();
    let server = RunningServer::start(config(RulesSource::File(rules), Some(files(dir.path())))).await;
    let app = server.app.clone();
    g.register_at(server.tls.port(), &certs.ca_pem, false, || {
        let app = app.clone();
        async move { app.metrics.encode() }
    })
    .await;

    g.create_route("shared", json!([])).await;
    // Each implementation reads the route and writes it back with its own
    // entry added or updated, under the resourceVersion it read.
    for (implementation, accepted) in [(ENVOY, "True"), (ISTIO, "True"), (ENVOY, "False")] {
        let client = g.client(implementation);
        let mut route = g.get(client, "shared").await;
        let mut parents: Vec<Value> = route["status"]["parents"].as_array().cloned().unwrap_or_default();
        parents.retain(|p| p["controllerName"] != implementation.controller_name);
        parents.push(parent(
            implementation,
            implementation.gateway_class,
            &[("Accepted", accepted)],
        ));
        route["status"]["parents"] = json!(parents);
        let written = g.put_status(client, &route).await;
        assert_eq!(written.code, 200, "{:?}", written.body);
    }

    let suggest = |extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_statusguard"))
            .args(["suggest", "httproutes.gateway.networking.k8s.io", "-n", &g.namespace])
            .args(extra)
            .env("KUBECONFIG", &g.cluster.kubeconfig)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        said
    };
    let draft = suggest(&[]);
    assert!(
        draft.contains("    # status.parents is owned whole (atomic list, by field manager ")
            && draft.contains("who writes which entry cannot be told from managedFields;\n    # observe writes"),
        "{draft}"
    );
    assert!(!draft.contains("    lists:\n"), "{draft}");

    // The observer counts writes off the request path: wait for both. The
    // record is saved to a file, as `suggest --observed` also reads one: the
    // server runs on this test's thread, which `suggest` blocks.
    let record = support::wait::retry_until(Duration::from_secs(15), "both implementations observed", || async {
        let record = server.observed().await;
        let text = record.to_string();
        if [ENVOY, ISTIO].iter().all(|i| text.contains(i.controller_name)) {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    let observed = dir.path().join("observed.json");
    std::fs::write(&observed, record).unwrap();
    let draft = suggest(&["--observed", observed.to_str().unwrap()]);
    assert!(
        draft.contains("    # its lists: entry below is drafted from the observed writes.\n    lists:\n      - path: parents\n        key: controllerName\n"),
        "{draft}"
    );
    let rules = Ownership::from_yaml(&draft).expect("check accepts the draft");
    let routes = rules.resource("gateway.networking.k8s.io", "httproutes").unwrap();
    for implementation in [ENVOY, ISTIO] {
        let writer = routes
            .writers
            .iter()
            .find(|w| w.username == implementation.username())
            .unwrap_or_else(|| panic!("{} not drafted:\n{draft}", implementation.username()));
        assert_eq!(
            writer.entries_of(&routes.lists[0].path),
            [implementation.controller_name],
            "{draft}"
        );
    }
    g.unregister().await;
}
