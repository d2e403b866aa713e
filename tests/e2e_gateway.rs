//! Gateway API on the real kube-apiserver with the real CRDs (pinned
//! sigs.k8s.io/gateway-api, standard channel): two implementations share an
//! HTTPRoute's `status.parents`, each entry keyed by its `controllerName`,
//! and statusguard guards them with examples/gateway-api.yaml in each mode.

mod support;

use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{WatchEvent, WatchParams};
use serde_json::{Value, json};
use statusguard::flush::{RetryPolicy, StatusWriter};
use statusguard::ownership::{GroupResource, Ownership};
use statusguard::rules::RulesSource;
use support::gateway::{ENVOY, GROUP, GatewayScenario, ISTIO, Implementation, controllers, httproutes, parent};
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

/// How many times each implementation flushes in the library race.
const FLUSHES: u64 = 30;

/// An implementation's entry carrying `counter` in its Accepted condition's
/// observedGeneration; `counted_entry(_, 1)` is the entry `route` creates.
fn counted_entry(implementation: Implementation, counter: u64) -> Value {
    let mut entry = parent(
        implementation,
        implementation.gateway_class,
        &[("Accepted", "True"), ("ResolvedRefs", "True")],
    );
    entry["conditions"][0]["observedGeneration"] = json!(counter);
    entry
}

/// The counters of `implementation`'s entries in one stored version, each
/// checked to be an entry the implementation wrote whole (not a mix).
fn counters(version: &Value, implementation: Implementation) -> Vec<u64> {
    let rv = &version["metadata"]["resourceVersion"];
    version["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["controllerName"] == implementation.controller_name)
        .map(|entry| {
            let counter = entry["conditions"][0]["observedGeneration"].as_u64().unwrap_or(0);
            assert_eq!(
                entry,
                &counted_entry(implementation, counter),
                "version {rv}: {implementation:?}'s entry is one it wrote"
            );
            counter
        })
        .collect()
}

/// The validating webhook's answers for httproutes, by decision.
fn validate_decisions(metrics: &str) -> Vec<(String, f64)> {
    decisions_at(metrics, "validate")
}

fn decisions_at(metrics: &str, endpoint: &str) -> Vec<(String, f64)> {
    let endpoint = format!("endpoint=\"{endpoint}\"");
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("statusguard_admission_requests_total{")
                && l.contains(&endpoint)
                && l.contains("resource=\"httproutes\"")
        })
        .filter_map(|l| {
            let decision = l.split("decision=\"").nth(1)?.split('"').next()?.to_owned();
            let value = l.rsplit(' ').next()?.parse().ok()?;
            Some((decision, value))
        })
        .collect()
}

/// Both implementations flush their own entry FLUSHES times at once through
/// the library, each from the copy it read once before the race (a stale
/// resourceVersion, a stale entry of the other implementation, its own entry
/// as it first read it), with a new counter in its entry each time. A watch
/// opened before the race records every stored version, and the oracle
/// checks each: both entries are there, in their places, each one its
/// implementation wrote, and neither counter ever goes down.
async fn library_flushes_race(g: &GatewayScenario, name: &str) {
    let created = route(g, name).await;
    let start = created["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let watched = httproutes(&g.admin, &g.namespace);
    let mut events = watched
        .watch(&WatchParams::default().fields(&format!("metadata.name={name}")), &start)
        .await
        .unwrap()
        .boxed();
    // Each successful flush stores exactly one version (its counter is new).
    let expected = usize::try_from(2 * FLUSHES).unwrap();
    let versions = async move {
        let mut versions: Vec<Value> = Vec::new();
        while versions.len() < expected {
            let event = tokio::time::timeout(Duration::from_secs(120), events.next())
                .await
                .unwrap_or_else(|_| panic!("only {} of {expected} versions were watched", versions.len()));
            match event {
                Some(Ok(WatchEvent::Modified(object))) => versions.push(serde_json::to_value(object).unwrap()),
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                other => panic!("after {} versions: {other:?}", versions.len()),
            }
        }
        versions
    };

    let ownership = Ownership::from_yaml(include_str!("../examples/gateway-api.yaml")).unwrap();
    let routes = GroupResource::new(GROUP, "httproutes");
    let mut stale = Vec::new();
    for implementation in [ENVOY, ISTIO] {
        let api = httproutes(g.client(implementation), &g.namespace);
        stale.push(api.get(name).await.unwrap());
    }
    let flusher = |implementation: Implementation, stale: kube::api::DynamicObject| {
        let (ownership, routes) = (&ownership, &routes);
        async move {
            let api = httproutes(g.client(implementation), &g.namespace);
            // Every first attempt conflicts (its resourceVersion is the stale
            // one) and a retry may lose the race again: room for both.
            let retry = RetryPolicy::new(100, Duration::from_millis(2))
                .unwrap()
                .jitter(1.0)
                .unwrap();
            let writer = StatusWriter::for_writer(api, ownership, routes, &implementation.username())
                .unwrap()
                .retry(retry);
            let mut attempts = Vec::new();
            for counter in 2..=FLUSHES + 1 {
                let mut staged = stale.clone();
                let parents = staged.data["status"]["parents"].as_array_mut().unwrap();
                let own = parents
                    .iter_mut()
                    .find(|p| p["controllerName"] == implementation.controller_name)
                    .unwrap();
                *own = counted_entry(implementation, counter);
                let report = writer
                    .flush(&mut staged)
                    .await
                    .unwrap_or_else(|e| panic!("{implementation:?}'s flush {counter}: {e}"));
                attempts.push(report.attempts);
            }
            attempts
        }
    };
    let mut stale = stale.into_iter();
    let (envoy_attempts, istio_attempts, versions) = tokio::join!(
        flusher(ENVOY, stale.next().unwrap()),
        flusher(ISTIO, stale.next().unwrap()),
        versions
    );

    // The watch saw every version there is: its last is the stored object.
    let stored = g.get(&g.admin, name).await;
    assert_eq!(
        versions.last().unwrap()["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"],
        "no version after the ones the flushes made"
    );
    // The oracle, on every stored version.
    let mut last = [1, 1];
    let mut writers = Vec::new();
    for version in &versions {
        let rv = &version["metadata"]["resourceVersion"];
        assert_eq!(
            controllers(version),
            [ENVOY.controller_name, ISTIO.controller_name],
            "version {rv}: both entries, once each, where they stood"
        );
        for (i, implementation) in [ENVOY, ISTIO].into_iter().enumerate() {
            let counter = counters(version, implementation)[0];
            assert!(
                counter >= last[i],
                "version {rv}: {implementation:?}'s entry rolled back from {} to {counter}",
                last[i]
            );
            if counter > last[i] {
                writers.push(i);
            }
            last[i] = counter;
        }
    }
    assert_eq!(
        last,
        [FLUSHES + 1; 2],
        "each entry holds its implementation's last flush"
    );
    assert_eq!(writers.len(), versions.len(), "each version is one flush");
    // Not vacuous: the flushes conflicted and the versions interleave.
    for (implementation, attempts) in [(ENVOY, &envoy_attempts), (ISTIO, &istio_attempts)] {
        assert!(
            attempts.iter().any(|&a| a > 1),
            "{implementation:?} never retried: {attempts:?}"
        );
    }
    let switches = writers.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches >= 2,
        "the two implementations' versions interleave: {writers:?}"
    );
    eprintln!(
        "library race: {switches} switches between writers; attempts envoy {envoy_attempts:?} istio {istio_attempts:?}"
    );
}

#[tokio::test]
async fn racing_library_flushes_under_enforce_never_roll_back_or_lose_an_entry() {
    let g = GatewayScenario::new("e2e-gateway-flush-enforce").await;
    let (server, _dir) = guard(&g, "enforce").await;
    let before = validate_decisions(&server.app.metrics.encode());
    library_flushes_race(&g, "library-race").await;
    let after = validate_decisions(&server.app.metrics.encode());
    let count = |decisions: &[(String, f64)], wanted: &str| -> f64 {
        decisions.iter().filter(|(d, _)| d == wanted).map(|(_, v)| v).sum()
    };
    assert_eq!(count(&after, "denied"), 0.0, "the library is never denied: {after:?}");
    // statusguard judged every stored flush (a write whose resourceVersion
    // is stale fails before validating admission).
    assert!(
        count(&after, "allowed") - count(&before, "allowed") >= (2 * FLUSHES) as f64,
        "{before:?} -> {after:?}"
    );
    g.unregister().await;
}

/// Under trim, the library's flushes never need a restore: the mutating
/// webhook trims nothing, and nothing is rolled back or lost.
#[tokio::test]
async fn racing_library_flushes_under_trim_are_never_trimmed() {
    let g = GatewayScenario::new("e2e-gateway-flush-trim").await;
    let (server, _dir) = guard(&g, "trim").await;
    library_flushes_race(&g, "library-race").await;
    let metrics = server.app.metrics.encode();
    let mutated = decisions_at(&metrics, "mutate");
    let count = |wanted: &str| -> f64 { mutated.iter().filter(|(d, _)| d == wanted).map(|(_, v)| v).sum() };
    assert_eq!(count("trimmed"), 0.0, "{mutated:?}");
    assert!(count("allowed") >= (2 * FLUSHES) as f64, "{mutated:?}");
    assert_eq!(
        validate_decisions(&metrics)
            .iter()
            .filter(|(d, _)| d == "denied")
            .count(),
        0
    );
    g.unregister().await;
}

#[tokio::test]
async fn racing_library_flushes_without_a_webhook_never_roll_back_or_lose_an_entry() {
    let g = GatewayScenario::new("e2e-gateway-flush-bare").await;
    library_flushes_race(&g, "library-race").await;
}
