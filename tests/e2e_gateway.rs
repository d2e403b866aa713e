//! Gateway API on the real kube-apiserver with the real CRDs (pinned
//! sigs.k8s.io/gateway-api, standard channel): two implementations share an
//! HTTPRoute's `status.parents`, each entry keyed by its `controllerName`,
//! and statusguard guards them with examples/gateway-api.yaml in each mode.

mod support;

use serde_json::{Value, json};
use statusguard::rules::RulesSource;
use support::gateway::{ENVOY, GatewayScenario, ISTIO, Implementation, controllers, parent};
use support::scenario::Written;
use support::webhook::{RunningServer, config, files, write_pair};

/// statusguard with examples/gateway-api.yaml in `mode`, registered for the
/// scenario's namespace.
async fn guard(g: &GatewayScenario, mode: &str) -> (RunningServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let example = include_str!("../examples/gateway-api.yaml").replace("mode: enforce", &format!("mode: {mode}"));
    assert!(example.contains(&format!("mode: {mode}")));
    let rules = dir.path().join("gateway-api.yaml");
    std::fs::write(&rules, example).unwrap();
    let server = RunningServer::start(config(RulesSource::File(rules), Some(files(dir.path())))).await;
    let app = server.app.clone();
    g.register_at(server.tls.port(), &certs.ca_pem, mode == "trim", || {
        let app = app.clone();
        async move { app.metrics.encode() }
    })
    .await;
    (server, dir)
}

fn envoy_entry(status: &str) -> Value {
    parent(
        ENVOY,
        ENVOY.gateway_class,
        &[("Accepted", status), ("ResolvedRefs", "True")],
    )
}

fn istio_entry(status: &str) -> Value {
    parent(
        ISTIO,
        ISTIO.gateway_class,
        &[("Accepted", status), ("ResolvedRefs", "True")],
    )
}

/// The name statusguard gives istio's entry in messages, without the
/// quoting of the key value (which is statusguard's to choose).
fn mentions_istio_entry(text: &str) -> bool {
    text.contains("status.parents[controllerName=") && text.contains(ISTIO.controller_name)
}

fn statusguard_warned(written: &Written) -> bool {
    written
        .warnings
        .iter()
        .any(|w| w.contains("statusguard") && mentions_istio_entry(w))
}

/// The answer to a write that changes istio's entries, by envoy, in `mode`.
fn assert_judged(mode: &str, what: &str, written: &Written) {
    match mode {
        "enforce" => {
            assert_eq!(written.code, 409, "{what}: {:?}", written.body);
            assert_eq!(written.body["reason"], "Conflict", "{what}");
            assert!(mentions_istio_entry(written.message()), "{what}: {}", written.message());
            assert!(
                written.message().contains(&ISTIO.username()),
                "{what}: names the owner: {}",
                written.message()
            );
        }
        _ => {
            assert_eq!(written.code, 200, "{what}: {:?}", written.body);
            assert!(statusguard_warned(written), "{what}: {:?}", written.warnings);
        }
    }
}

/// A route attached to both Gateways, one entry of each implementation.
async fn route(g: &GatewayScenario, name: &str) -> Value {
    g.create_route(name, json!([envoy_entry("True"), istio_entry("True")]))
        .await
}

async fn parents(g: &GatewayScenario, name: &str) -> Value {
    g.get(&g.admin, name).await["status"]["parents"].clone()
}

/// The bug of gateway-api #3846: envoy read the route, then istio updated
/// its entry; envoy rebuilds the list from its own entries only and retries
/// its full UpdateStatus with a refreshed resourceVersion.
async fn stale_update_that_drops_the_other_entry(g: &GatewayScenario, mode: &str) {
    let name = "stale-drop";
    route(g, name).await;
    let mut stale = g.get(&g.envoy, name).await;

    let mut fresh = g.get(&g.istio, name).await;
    fresh["status"]["parents"][1] = istio_entry("False");
    let written = g.put_status(&g.istio, &fresh).await;
    assert_eq!(written.code, 200, "istio's own write: {:?}", written.body);

    stale["status"]["parents"] = json!([envoy_entry("False")]);
    let first = g.put_status(&g.envoy, &stale).await;
    assert_eq!(first.code, 409, "the stale write conflicts: {:?}", first.body);
    stale["metadata"]["resourceVersion"] = g.get(&g.envoy, name).await["metadata"]["resourceVersion"].clone();
    let retry = g.put_status(&g.envoy, &stale).await;
    assert_judged(mode, "stale UpdateStatus dropping istio's entry", &retry);

    let stored = parents(g, name).await;
    match mode {
        "enforce" => assert_eq!(stored, json!([envoy_entry("True"), istio_entry("False")])),
        "trim" => assert_eq!(
            stored,
            json!([envoy_entry("False"), istio_entry("False")]),
            "envoy's change stored, istio's entry as istio wrote it"
        ),
        _ => assert_eq!(stored, json!([envoy_entry("False")]), "audit only reports"),
    }
}

/// The stale retry that keeps istio's entry but in its old state.
async fn stale_update_that_rolls_back_the_other_entry(g: &GatewayScenario, mode: &str) {
    let name = "stale-rollback";
    route(g, name).await;
    let mut stale = g.get(&g.envoy, name).await;
    let mut fresh = g.get(&g.istio, name).await;
    fresh["status"]["parents"][1] = istio_entry("False");
    assert_eq!(g.put_status(&g.istio, &fresh).await.code, 200);

    stale["status"]["parents"][0] = envoy_entry("False");
    stale["metadata"]["resourceVersion"] = g.get(&g.envoy, name).await["metadata"]["resourceVersion"].clone();
    let retry = g.put_status(&g.envoy, &stale).await;
    assert_judged(mode, "stale UpdateStatus rolling back istio's entry", &retry);
    let stored = parents(g, name).await;
    let expected = match mode {
        "enforce" => json!([envoy_entry("True"), istio_entry("False")]),
        "trim" => json!([envoy_entry("False"), istio_entry("False")]),
        _ => json!([envoy_entry("False"), istio_entry("True")]),
    };
    assert_eq!(stored, expected, "{mode}");
}

/// envoy adds an entry under istio's controllerName.
async fn entry_under_the_other_controller_name(g: &GatewayScenario, mode: &str) {
    let name = "foreign-key";
    route(g, name).await;
    let mut object = g.get(&g.envoy, name).await;
    let forged = parent(ISTIO, "forged", &[("Accepted", "True")]);
    object["status"]["parents"].as_array_mut().unwrap().push(forged.clone());
    let written = g.put_status(&g.envoy, &object).await;
    assert_judged(mode, "an entry under istio's controllerName", &written);
    let stored = parents(g, name).await;
    if mode == "audit" {
        assert_eq!(stored, json!([envoy_entry("True"), istio_entry("True"), forged]));
    } else {
        assert_eq!(stored, json!([envoy_entry("True"), istio_entry("True")]), "{mode}");
    }
}

/// envoy rewrites istio's entry under its own controllerName. Trim puts
/// istio's entry back and keeps envoy's new one.
async fn take_over(g: &GatewayScenario, mode: &str) {
    let name = "take-over";
    route(g, name).await;
    let mut object = g.get(&g.envoy, name).await;
    let taken = parent(
        ENVOY,
        ISTIO.gateway_class,
        &[("Accepted", "True"), ("ResolvedRefs", "True")],
    );
    object["status"]["parents"][1] = taken.clone();
    let written = g.put_status(&g.envoy, &object).await;
    assert_judged(mode, "a take-over of istio's entry", &written);
    let stored = parents(g, name).await;
    match mode {
        "enforce" => assert_eq!(stored, json!([envoy_entry("True"), istio_entry("True")])),
        "trim" => {
            let stored = stored.as_array().unwrap();
            assert_eq!(stored.len(), 3, "{stored:?}");
            assert!(
                stored.contains(&taken) && stored.contains(&istio_entry("True")),
                "{stored:?}"
            );
        }
        _ => assert_eq!(stored, json!([envoy_entry("True"), taken])),
    }
}

/// Reordering the list changes no one's entries: allowed, no warning.
async fn reorder(g: &GatewayScenario, mode: &str) {
    let name = "reorder";
    route(g, name).await;
    let mut object = g.get(&g.envoy, name).await;
    object["status"]["parents"] = json!([istio_entry("True"), envoy_entry("True")]);
    let written = g.put_status(&g.envoy, &object).await;
    assert_eq!((written.code, written.warnings.len()), (200, 0), "{mode}: {written:?}");
    assert_eq!(
        controllers(&g.get(&g.admin, name).await),
        [ISTIO.controller_name, ENVOY.controller_name]
    );
}

/// Each implementation updates only its own entry, many times, at once:
/// reads, changes its entry, writes with the resourceVersion, and on the
/// API server's own conflict reads again. statusguard never denies or warns.
async fn concurrent_own_entries(g: &GatewayScenario, mode: &str) {
    let name = "concurrent";
    route(g, name).await;
    let rounds = 10;
    let writer = |implementation: Implementation, index: usize| async move {
        let client = g.client(implementation);
        for round in 0..rounds {
            let status = if round % 2 == 0 { "False" } else { "True" };
            let mut attempts = 0;
            loop {
                attempts += 1;
                assert!(attempts < 50, "{mode}: {implementation:?} never got through");
                let mut object = g.get(client, name).await;
                let position = object["status"]["parents"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .position(|p| p["controllerName"] == implementation.controller_name)
                    .unwrap_or(index);
                object["status"]["parents"][position] = parent(
                    implementation,
                    implementation.gateway_class,
                    &[("Accepted", status), ("ResolvedRefs", "True")],
                );
                let written = g.put_status(client, &object).await;
                assert!(
                    !written.message().contains("admission webhook") && written.warnings.is_empty(),
                    "{mode}: {implementation:?} was judged for its own entry: {written:?}"
                );
                match written.code {
                    200 => break,
                    409 => continue, // the resourceVersion moved on: read again
                    code => panic!("{mode}: {code}: {:?}", written.body),
                }
            }
        }
    };
    tokio::join!(writer(ENVOY, 0), writer(ISTIO, 1));
    let stored = parents(g, name).await;
    let last = if (rounds - 1) % 2 == 0 { "False" } else { "True" };
    assert_eq!(
        stored,
        json!([envoy_entry(last), istio_entry(last)]),
        "{mode}: both writers' last values"
    );
}

/// kubectl-style server-side apply by envoy with force, holding only its
/// entry: the atomic list is replaced whole, dropping istio's entry.
async fn forced_apply_of_the_whole_list(g: &GatewayScenario, mode: &str) {
    let name = "forced-apply";
    route(g, name).await;
    let written = g
        .apply_status(
            &g.envoy,
            "envoy-gateway",
            name,
            json!({"parents": [envoy_entry("False")]}),
            true,
        )
        .await;
    assert_judged(mode, "a forced apply of the whole list", &written);
    let stored = parents(g, name).await;
    match mode {
        "enforce" => {
            assert!(
                written.message().contains("--force-conflicts"),
                "says that --force-conflicts does not override ownership: {}",
                written.message()
            );
            assert_eq!(stored, json!([envoy_entry("True"), istio_entry("True")]));
        }
        "trim" => {
            let stored = stored.as_array().unwrap();
            assert_eq!(stored.len(), 2, "{stored:?}");
            assert!(stored.contains(&envoy_entry("False")) && stored.contains(&istio_entry("True")));
        }
        _ => assert_eq!(stored, json!([envoy_entry("False")])),
    }
}

async fn every_case(mode: &str) {
    let g = GatewayScenario::new(&format!("e2e-gateway-{mode}")).await;
    let (_server, _dir) = guard(&g, mode).await;
    stale_update_that_drops_the_other_entry(&g, mode).await;
    stale_update_that_rolls_back_the_other_entry(&g, mode).await;
    entry_under_the_other_controller_name(&g, mode).await;
    take_over(&g, mode).await;
    reorder(&g, mode).await;
    concurrent_own_entries(&g, mode).await;
    forced_apply_of_the_whole_list(&g, mode).await;
    g.unregister().await;
}

#[tokio::test]
async fn enforce_denies_every_write_that_changes_the_other_implementations_entries() {
    every_case("enforce").await;
}

#[tokio::test]
async fn trim_restores_the_other_implementations_entries_and_keeps_the_writers_own() {
    every_case("trim").await;
}

#[tokio::test]
async fn audit_lets_every_write_pass_and_warns_about_the_other_implementations_entries() {
    every_case("audit").await;
}

#[tokio::test]
async fn without_statusguard_a_stale_rebuild_erases_the_other_implementations_entry() {
    let g = GatewayScenario::new("e2e-gateway-bug").await;
    route(&g, "bug").await;
    let mut object = g.get(&g.envoy, "bug").await;
    object["status"]["parents"] = json!([envoy_entry("False")]);
    assert_eq!(g.put_status(&g.envoy, &object).await.code, 200);
    assert_eq!(controllers(&g.get(&g.admin, "bug").await), [ENVOY.controller_name]);
}

#[tokio::test]
async fn the_gateway_api_example_passes_check() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_statusguard"))
        .arg("check")
        .arg(support::webhook::example("gateway-api.yaml"))
        .env("KUBECONFIG", &support::cluster::Cluster::shared().kubeconfig)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
