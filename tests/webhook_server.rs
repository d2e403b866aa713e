//! The real webhook server on loopback, with real TLS clients.

mod support;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use statusguard::rules::RulesSource;
use support::webhook::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn stale_review() -> Value {
    serde_json::from_str(&std::fs::read_to_string(example("stale-rollback-review.json")).unwrap()).unwrap()
}

/// The example ownership document with another default mode, as a file.
fn ownership_in_mode(dir: &std::path::Path, mode: &str) -> RulesSource {
    let text = std::fs::read_to_string(example("ownership.yaml"))
        .unwrap()
        .replace("mode: enforce", &format!("mode: {mode}"));
    let path = dir.join(format!("ownership-{mode}.yaml"));
    std::fs::write(&path, text).unwrap();
    RulesSource::File(path)
}

async fn post(client: &reqwest::Client, url: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn review_response(client: &reqwest::Client, url: &str, review: &Value) -> Value {
    let (status, body) = post(client, url, serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], review["request"]["uid"], "the uid is echoed");
    answer["response"].clone()
}

async fn start_in_mode(mode: &str) -> (RunningServer, reqwest::Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let server = RunningServer::start(config(ownership_in_mode(dir.path(), mode), Some(files(dir.path())))).await;
    (server, https_client(&certs.ca_pem), dir)
}

#[tokio::test]
async fn enforce_denies_the_stale_rollback_with_409_and_mutate_allows() {
    let (server, client, _dir) = start_in_mode("enforce").await;
    let response = review_response(&client, &server.url("/validate"), &stale_review()).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 409);
    assert_eq!(response["status"]["reason"], "Conflict");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("status.observedGeneration (owned by system:serviceaccount:platform:widget-controller)"));
    let response = review_response(&client, &server.url("/mutate"), &stale_review()).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none());
}

#[tokio::test]
async fn trim_answers_with_a_base64_json_patch_that_restores_the_owners_items() {
    let (server, client, _dir) = start_in_mode("trim").await;
    let review = stale_review();
    let response = review_response(&client, &server.url("/mutate"), &review).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let encoded = response["patch"]
        .as_str()
        .expect("the patch is a base64 string on the wire");
    let patch: json_patch::Patch =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(encoded).unwrap()).unwrap();
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(
        object["status"]["observedGeneration"],
        review["request"]["oldObject"]["status"]["observedGeneration"]
    );
    assert_eq!(object["status"]["replicas"], 5, "the writer's own change stays");
    assert_eq!(response["warnings"].as_array().unwrap().len(), 2);

    // The backstop: /validate of a trim resource denies what was not trimmed.
    let response = review_response(&client, &server.url("/validate"), &review).await;
    assert_eq!(response["status"]["code"], 409);
}

#[tokio::test]
async fn audit_allows_with_warnings_and_audit_annotations() {
    let (server, client, _dir) = start_in_mode("audit").await;
    let response = review_response(&client, &server.url("/validate"), &stale_review()).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(response["warnings"].as_array().unwrap().len(), 2);
    assert!(
        response["auditAnnotations"]["violations"]
            .as_str()
            .unwrap()
            .contains("status.observedGeneration")
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_status_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let mut cfg = config(RulesSource::Embedded, Some(files(dir.path())));
    cfg.limits.max_body_bytes = 64 * 1024;
    let server = RunningServer::start(cfg).await;
    let client = https_client(&certs.ca_pem);
    let url = server.url("/validate");

    let mut no_request = stale_review();
    no_request.as_object_mut().unwrap().remove("request");
    let mut beta = stale_review();
    beta["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_old = stale_review();
    no_old["request"]["oldObject"] = Value::Null;
    // (what, body, status, a phrase of the one-line reason)
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("malformed JSON", b"{\"apiVersion\":".to_vec(), 400, "malformed JSON"),
        ("not JSON at all", b"hello".to_vec(), 400, "malformed JSON"),
        ("empty body", vec![], 400, "malformed JSON"),
        (
            "not a review",
            br#"{"kind":"Pod","apiVersion":"v1","spec":{}}"#.to_vec(),
            400,
            "AdmissionReview",
        ),
        (
            "no request",
            serde_json::to_vec(&no_request).unwrap(),
            400,
            "has no request",
        ),
        ("v1beta1", serde_json::to_vec(&beta).unwrap(), 400, "unsupported review"),
        ("over the body limit", vec![b' '; 65 * 1024], 413, "over 65536 bytes"),
    ];
    for (what, body, status, reason) in cases {
        let (got, text) = post(&client, &url, body).await;
        assert_eq!(got, status, "{what}: {text}");
        assert!(text.contains(reason) && text.lines().count() == 1, "{what}: {text:?}");
    }
    // A review that parsed but cannot be decided is denied in the review
    // itself, so the API server shows the writer why.
    let response = review_response(&client, &url, &no_old).await;
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 400);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("must carry oldObject"), "{message}");

    let got = client.get(&url).send().await.unwrap().status().as_u16();
    assert_eq!(got, 405, "GET");
    let got = client
        .put(server.url("/mutate"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(got, 405, "PUT");
    let got = client
        .post(server.url("/other"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(got, 404);

    // Still serving, and the errors were counted.
    let response = review_response(&client, &url, &stale_review()).await;
    assert_eq!(response["status"]["code"], 409);
    let metrics = server.metrics().await;
    assert!(metrics.contains(r#"decision="error"} 7"#), "{metrics}");
}

#[tokio::test]
async fn plain_http_on_the_tls_port_is_never_answered() {
    let (server, _client, _dir) = start_in_mode("enforce").await;
    let result = plain_client()
        .post(format!("http://{}/validate", server.tls))
        .body("{}")
        .send()
        .await;
    assert!(result.is_err(), "plain HTTP got an answer: {result:?}");
}

#[tokio::test]
async fn the_ipv6_wildcard_serves_ipv4_and_ipv6_clients() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let wildcard: std::net::SocketAddr = "[::]:0".parse().unwrap();
    let mut config = config(RulesSource::Embedded, Some(files(dir.path())));
    (config.listen, config.admin_listen) = (wildcard, wildcard);
    let server = RunningServer::start(config).await;
    let mut loopbacks = vec!["127.0.0.1"];
    // IPv6 too where this machine has it (the server falls back to IPv4 where not).
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        loopbacks.push("[::1]");
    }
    let client = https_client(&certs.ca_pem);
    for host in loopbacks {
        let readyz = plain_client()
            .get(format!("http://{host}:{}/readyz", server.admin.port()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("the admin port over {host}: {e}"));
        assert_eq!(readyz.status(), 200, "{host}");
        let answer = review_response(
            &client,
            &format!("https://{host}:{}/validate", server.tls.port()),
            &stale_review(),
        )
        .await;
        assert_eq!(answer["allowed"], false, "{host}");
    }
}

#[tokio::test]
async fn tls_1_2_and_1_3_are_both_served() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let tcp = tokio::net::TcpStream::connect(server.tls).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = tls_connector(&certs.ca_pem, &[version])
            .connect(name, tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.protocol_version(), Some(version.version));
    }
}

#[tokio::test]
async fn a_certificate_chain_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    // leaf + CA in one file, as cert-manager writes tls.crt
    std::fs::write(
        dir.path().join("tls.crt"),
        format!("{}{}", certs.cert_pem, certs.ca_pem),
    )
    .unwrap();
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    let response = review_response(&https_client(&certs.ca_pem), &server.url("/validate"), &stale_review()).await;
    assert_eq!(response["status"]["code"], 409);
}

/// Polls until a client that trusts only `ca_pem` can talk to the server.
async fn wait_until_served_by(server: &RunningServer, ca_pem: &str) {
    let client = https_client(ca_pem);
    eventually(Duration::from_secs(10), "the new certificate is served", || {
        let client = client.clone();
        let url = server.url("/validate");
        async move { client.get(url).send().await.is_ok() }
    })
    .await;
}

#[tokio::test]
async fn rotation_in_place_is_served_to_new_connections_without_breaking_in_flight_requests() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_pair(dir.path());
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    let body = serde_json::to_vec(&stale_review()).unwrap();
    let mut second = None;
    let response = split_request(server.tls, &first.ca_pem, "/validate", &body, async {
        second = Some(write_pair(dir.path()));
        wait_until_served_by(&server, &second.as_ref().unwrap().ca_pem).await;
    })
    .await;
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "the in-flight request broke: {response}"
    );
    assert!(response.contains("\"code\":409"));
    // The old CA no longer verifies new connections.
    assert!(
        https_client(&first.ca_pem)
            .get(server.url("/validate"))
            .send()
            .await
            .is_err()
    );
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(r#"statusguard_tls_reloads_total{result="success"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn rotation_by_kubelet_symlink_swap_is_served() {
    // A Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let make_version = |name: &str| {
        let version = root.join(name);
        std::fs::create_dir(&version).unwrap();
        write_pair(&version)
    };
    let first = make_version("..2026_12_02_00_00_00.1");
    std::os::unix::fs::symlink("..2026_12_02_00_00_00.1", root.join("..data")).unwrap();
    for file in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), root.join(file)).unwrap();
    }
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(root)))).await;
    wait_until_served_by(&server, &first.ca_pem).await;

    let second = make_version("..2026_12_02_00_10_00.2");
    std::os::unix::fs::symlink("..2026_12_02_00_10_00.2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(root.join("..2026_12_02_00_00_00.1")).unwrap();
    wait_until_served_by(&server, &second.ca_pem).await;
}

#[tokio::test]
async fn a_half_written_rotation_keeps_the_old_pair_until_the_key_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_pair(dir.path());
    let server = RunningServer::start(config(RulesSource::Embedded, Some(files(dir.path())))).await;
    let next = statusguard::cluster::certs::policy::generate_certificates(&[]).unwrap();
    std::fs::write(dir.path().join("tls.crt"), &next.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The new certificate does not fit the old key: the old pair stays.
    let response = review_response(&https_client(&first.ca_pem), &server.url("/validate"), &stale_review()).await;
    assert_eq!(response["status"]["code"], 409);
    std::fs::write(dir.path().join("tls.key"), &next.key_pem).unwrap();
    wait_until_served_by(&server, &next.ca_pem).await;
    // The half-written pair was really seen and refused (the counter starts at 0).
    let refused = metric(
        &server.metrics().await,
        r#"statusguard_tls_reloads_total{result="error"}"#,
    );
    assert!(refused.is_some_and(|n| n >= 1.0), "{refused:?}");
}

#[tokio::test]
async fn metrics_name_decisions_violations_and_rules() {
    let (server, client, _dir) = start_in_mode("enforce").await;
    review_response(&client, &server.url("/validate"), &stale_review()).await;
    let mut skipped = stale_review();
    skipped["request"]["resource"]["resource"] = json!("gizmos");
    review_response(&client, &server.url("/validate"), &skipped).await;
    let metrics = server.metrics().await;
    for expected in [
        r#"statusguard_admission_requests_total{endpoint="validate",group="example.com",resource="widgets",decision="denied"} 1"#,
        r#"statusguard_admission_requests_total{endpoint="validate",group="(unconfigured)",resource="(unconfigured)",decision="skipped"} 1"#,
        r#"statusguard_violations_total{group="example.com",resource="widgets",owner="system:serviceaccount:platform:widget-controller",item="status.observedGeneration"} 1"#,
        r#"statusguard_admission_duration_seconds_count{endpoint="validate"} 2"#,
        "statusguard_rules_generation 1",
        r#"statusguard_tls_reloads_total{result="error"} 0"#,
    ] {
        assert!(metrics.contains(expected), "missing {expected}\n{metrics}");
    }
    assert!(!metrics.contains("w1"), "object names never become labels");
}

#[tokio::test]
async fn a_stuck_client_is_cut_off_and_a_slow_body_gets_408() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_pair(dir.path());
    let mut cfg = config(RulesSource::Embedded, Some(files(dir.path())));
    cfg.limits.header_read_timeout = Duration::from_secs(1);
    cfg.limits.request_timeout = Duration::from_secs(1);
    let server = RunningServer::start(cfg).await;

    // Headers that never finish: the connection is closed.
    let tcp = tokio::net::TcpStream::connect(server.tls).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tls_connector(&certs.ca_pem, rustls::DEFAULT_VERSIONS)
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the stuck connection was not closed");

    // A body that stops half way: 408.
    let body = serde_json::to_vec(&stale_review()).unwrap();
    let response = split_request(
        server.tls,
        &certs.ca_pem,
        "/validate",
        &body,
        tokio::time::sleep(Duration::from_secs(2)),
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
}

// ---- the binary -------------------------------------------------------------

async fn start_binary(dir: &std::path::Path) -> (Process, u16, u16, String) {
    let server = BinaryServer::start(dir, &[], &[]).await;
    server.wait_ready().await;
    let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    (server.process, server.tls, server.admin, ca_pem)
}

/// Waits, off the runtime's threads, for the process to exit on its own
/// (it is not killed, as dropping it would).
async fn exit_status(mut process: Process) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || {
        let status = process.0.wait().unwrap();
        std::mem::forget(process);
        status
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn sigterm_turns_readiness_503_drains_the_in_flight_request_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let (process, tls, admin, ca_pem) = start_binary(dir.path()).await;
    let body = serde_json::to_vec(&stale_review()).unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], tls));
    let response = split_request(addr, &ca_pem, "/validate", &body, async {
        signal(&process.0, "TERM");
        eventually(Duration::from_secs(10), "readiness turns 503", || async move {
            matches!(plain_client().get(format!("http://127.0.0.1:{admin}/readyz")).send().await, Ok(r) if r.status() == 503)
        })
        .await;
    })
    .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"code\":409"));
    // One JSON log line for the denial, with the facts an operator needs.
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    let denial: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["decision"] == "denied")
        .unwrap_or_else(|| panic!("no denial logged:\n{log}"));
    assert_eq!(denial["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(denial["writer"], "system:serviceaccount:platform:widget-scaler");
    assert_eq!(
        (denial["name"].as_str(), denial["namespace"].as_str()),
        (Some("w1"), Some("shop"))
    );
    assert!(
        denial["violations"]
            .as_str()
            .unwrap()
            .contains("status.observedGeneration"),
        "{denial}"
    );
    assert_eq!(exit_status(process).await.code(), Some(0));
}

/// Issue 14: with a shutdown delay, SIGTERM turns readiness 503 at once
/// while new connections are still accepted and answered (the endpoints
/// controller and the API server have not stopped sending yet), each
/// HTTP/1.1 answer then closing its connection so that the caller dials
/// anew; after the delay the server stops accepting and exits 0.
#[tokio::test]
async fn a_shutdown_delay_keeps_answering_new_connections_while_readiness_is_503() {
    let dir = tempfile::tempdir().unwrap();
    let server = BinaryServer::start(dir.path(), &["--shutdown-delay", "3s"], &[]).await;
    server.wait_ready().await;
    let ca_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let url = format!("https://localhost:{}/validate", server.tls);
    let keep_alive = https_client(&ca_pem);
    let connection_header = |url: String| {
        let keep_alive = keep_alive.clone();
        async move {
            let response = keep_alive
                .post(url)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&stale_review()).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response
                .headers()
                .get("connection")
                .map(|v| v.to_str().unwrap().to_owned())
        }
    };
    assert_eq!(connection_header(url.clone()).await, None, "kept alive while serving");
    let signalled = std::time::Instant::now();
    signal(&server.process.0, "TERM");
    eventually(Duration::from_secs(2), "readiness turns 503 at once", || async {
        matches!(server.get_admin("/readyz").await, Some((503, _)))
    })
    .await;
    // The connection opened before the signal: answered, then closed.
    assert_eq!(connection_header(url.clone()).await.as_deref(), Some("close"));
    // A new client: a new connection, accepted and answered during the delay.
    let response = review_response(&https_client(&ca_pem), &url, &stale_review()).await;
    assert_eq!(response["status"]["code"], 409, "{response}");
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "answered within the delay"
    );
    let status = exit_status(server.process).await;
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "exited only after the delay"
    );
    assert_eq!(status.code(), Some(0));
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", server.tls)).await.is_err());
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut process, tls, _admin, ca_pem) = start_binary(dir.path()).await;
    // An in-flight request that never finishes keeps the drain waiting.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", tls)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stuck = tls_connector(&ca_pem, rustls::DEFAULT_VERSIONS)
        .connect(name, tcp)
        .await
        .unwrap();
    stuck
        .write_all(b"POST /validate HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        .await
        .unwrap();
    stuck.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(&process.0, "TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        process.0.try_wait().unwrap().is_none(),
        "the first signal drains, it does not exit"
    );
    signal(&process.0, "INT");
    let mut exited = None;
    for _ in 0..50 {
        if let Some(status) = process.0.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = exited.expect("the second signal ends the process");
    assert_eq!(status.code(), Some(130));
}

/// Issue 16: every status write of a guarded resource is recorded off the
/// request path, by identity and item, denied or not; a dry run is not.
#[tokio::test]
async fn the_admin_port_serves_who_changed_which_items() {
    let (server, client, _dir) = start_in_mode("enforce").await;
    let url = server.url("/validate");
    review_response(&client, &url, &stale_review()).await;
    let mut dry = stale_review();
    dry["request"]["dryRun"] = json!(true);
    dry["request"]["userInfo"]["username"] = json!("dry-runner");
    review_response(&client, &url, &dry).await;
    // A second write by the same writer, of another item only.
    let mut second = stale_review();
    second["request"]["object"]["status"] = second["request"]["oldObject"]["status"].clone();
    second["request"]["object"]["status"]["replicas"] = json!(7);
    review_response(&client, &url, &second).await;
    let observed = support::wait::retry_until(Duration::from_secs(5), "both writes are recorded", || async {
        let observed = server.observed().await;
        match observed["resources"][0]["writers"][0]["writes"].as_u64() {
            Some(2) => Ok(observed),
            _ => Err(observed),
        }
    })
    .await;
    let writers = observed["resources"][0]["writers"].as_array().unwrap();
    assert_eq!(writers.len(), 1, "the dry run is not recorded: {observed}");
    assert_eq!(
        writers[0],
        json!({"identity": "system:serviceaccount:platform:widget-scaler", "writes": 2,
               "fields": {"observedGeneration": 1, "replicas": 2}, "conditions": {"Ready": 1}})
    );
    assert_eq!(observed["resources"][0]["resource"], "widgets");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains(
            "statusguard_observed_writes_total{group=\"example.com\",resource=\"widgets\",writer=\"system:serviceaccount:platform:widget-scaler\"} 2"
        ),
        "{metrics}"
    );
}

/// A trim resource's write passes /mutate and then /validate: it is
/// recorded once, at /mutate, where it is seen before it is trimmed.
#[tokio::test]
async fn a_trimmed_write_is_recorded_once() {
    let (server, client, _dir) = start_in_mode("trim").await;
    review_response(&client, &server.url("/mutate"), &stale_review()).await;
    review_response(&client, &server.url("/validate"), &stale_review()).await;
    // One consumer takes the queue in order: once a later write is
    // recorded, the /validate call has been dealt with too.
    let mut marker = stale_review();
    marker["request"]["userInfo"]["username"] = json!("marker");
    review_response(&client, &server.url("/mutate"), &marker).await;
    let observed = support::wait::retry_until(Duration::from_secs(5), "the marker write is recorded", || async {
        let observed = server.observed().await;
        let writers = observed["resources"][0]["writers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        match writers.iter().any(|w| w["identity"] == "marker") {
            true => Ok(writers),
            false => Err(observed),
        }
    })
    .await;
    let scaler = writers_named(&observed, "system:serviceaccount:platform:widget-scaler");
    assert_eq!(scaler["writes"], 1, "{observed:?}");
    assert_eq!(scaler["fields"], json!({"observedGeneration": 1, "replicas": 1}));
}

fn writers_named<'a>(writers: &'a [Value], identity: &str) -> &'a Value {
    writers
        .iter()
        .find(|w| w["identity"] == identity)
        .unwrap_or_else(|| panic!("{identity} is not recorded: {writers:?}"))
}
