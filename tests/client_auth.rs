//! `--client-ca-file`: the TLS port answers only callers with a client
//! certificate from the configured CAs, on loopback with real TLS clients.
//! (`tests/e2e_mtls.rs` does the same with the real kube-apiserver as caller.)

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use statusguard::rules::RulesSource;
use support::mtls::{ClientIdentity, connector, exchange, h2_connector, refusal};
use support::webhook::*;

fn stale_review() -> Vec<u8> {
    std::fs::read(example("stale-rollback-review.json")).unwrap()
}

/// The embedded rules, a fresh serving pair, and `client_ca` as the client CA
/// file (`None`: no client certificate asked for).
async fn start(dir: &Path, client_ca: Option<&Path>) -> (RunningServer, String) {
    let certs = write_pair(dir);
    let mut config = config(RulesSource::Embedded, Some(files(dir)));
    config.client_ca_file = client_ca.map(Path::to_owned);
    (RunningServer::start(config).await, certs.ca_pem)
}

/// `identity`'s CA written to `dir` as the client CA file.
fn client_ca_file(dir: &Path, identity: &ClientIdentity) -> std::path::PathBuf {
    let file = dir.join("client-ca.crt");
    std::fs::write(&file, &identity.ca_pem).unwrap();
    file
}

/// The review's answer through `connector`, or why there was none.
async fn answer(server: &RunningServer, connector: &tokio_rustls::TlsConnector) -> Result<String, String> {
    exchange(server.tls, connector, "/validate", &stale_review()).await
}

fn assert_denied_409(answer: &Result<String, String>) {
    let response = answer.as_ref().unwrap_or_else(|e| panic!("no answer: {e}"));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"code\":409"), "the decision was made: {response}");
}

/// A request that got no answer.
fn assert_unanswered(answer: &Result<String, String>, what: &str) {
    if let Ok(response) = answer {
        panic!("{what}: answered: {response}");
    }
}

/// The server refuses `connector`'s handshake with an alert naming `reason`.
async fn assert_refused(addr: std::net::SocketAddr, connector: &tokio_rustls::TlsConnector, reason: &str, what: &str) {
    match refusal(addr, connector).await {
        Some(e) => assert!(e.contains("alert") && e.contains(reason), "{what}: {e}"),
        None => panic!("{what}: the handshake was accepted"),
    }
}

const BOTH_VERSIONS: [&[&rustls::SupportedProtocolVersion]; 2] =
    [&[&rustls::version::TLS13], &[&rustls::version::TLS12]];

#[tokio::test]
async fn with_a_client_ca_only_callers_with_its_certificates_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let apiserver = ClientIdentity::new("kube-apiserver");
    let stranger = ClientIdentity::new("stranger");
    let ca_file = client_ca_file(dir.path(), &apiserver);
    let (server, server_ca) = start(dir.path(), Some(&ca_file)).await;

    for versions in BOTH_VERSIONS {
        let with_cert = answer(&server, &connector(&server_ca, Some(&apiserver), versions)).await;
        assert_denied_409(&with_cert);
        let without = connector(&server_ca, None, versions);
        assert_unanswered(&answer(&server, &without).await, "without a certificate");
        let other_ca = connector(&server_ca, Some(&stranger), versions);
        assert_unanswered(&answer(&server, &other_ca).await, "with another CA's certificate");
        // The alert names the reason (TLS 1.2 has no "certificate required").
        let missing = if versions[0] == &rustls::version::TLS13 {
            "CertificateRequired"
        } else {
            ""
        };
        assert_refused(
            server.tls,
            &without,
            missing,
            &format!("{versions:?} without a certificate"),
        )
        .await;
        assert_refused(
            server.tls,
            &other_ca,
            "UnknownCA",
            &format!("{versions:?} with another CA's certificate"),
        )
        .await;
    }

    // An ordinary HTTPS client (HTTP/2 when offered), with and without.
    let client = |identity: Option<&ClientIdentity>| {
        let builder = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(server_ca.as_bytes()).unwrap())
            .timeout(Duration::from_secs(20));
        match identity {
            Some(identity) => builder.identity(identity.reqwest_identity()),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let post = |client: reqwest::Client| {
        client
            .post(server.url("/validate"))
            .header("content-type", "application/json")
            .body(stale_review())
            .send()
    };
    let answered: Value = post(client(Some(&apiserver))).await.unwrap().json().await.unwrap();
    assert_eq!(answered["response"]["status"]["code"], 409);
    assert!(post(client(None)).await.is_err());
    assert!(post(client(Some(&stranger))).await.is_err());
}

#[tokio::test]
async fn without_a_client_ca_no_certificate_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (server, server_ca) = start(dir.path(), None).await;
    let anyone = ClientIdentity::new("anyone");
    for versions in BOTH_VERSIONS {
        assert_denied_409(&answer(&server, &connector(&server_ca, None, versions)).await);
        assert_denied_409(&answer(&server, &connector(&server_ca, Some(&anyone), versions)).await);
    }
}

/// Polls until `identity` gets an answer (`true`) or is refused (`false`).
async fn wait_until_answered(server: &RunningServer, server_ca: &str, identity: &ClientIdentity, answered: bool) {
    let connector = connector(server_ca, Some(identity), rustls::DEFAULT_VERSIONS);
    eventually(Duration::from_secs(10), "the new client CA is in force", || {
        let connector = connector.clone();
        async move { answer(server, &connector).await.is_ok() == answered }
    })
    .await;
}

#[tokio::test]
async fn a_client_ca_rotated_by_kubelet_symlink_swap_is_trusted_and_a_broken_one_is_not() {
    // A ConfigMap volume: ca.crt -> ..data/ca.crt, ..data -> ..<timestamp>/
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("client-ca");
    std::fs::create_dir(&volume).unwrap();
    let version = |name: &str, pem: &str| {
        std::fs::create_dir(volume.join(name)).unwrap();
        std::fs::write(volume.join(name).join("ca.crt"), pem).unwrap();
        std::os::unix::fs::symlink(name, volume.join("..data_tmp")).unwrap();
        std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    };
    let (old, new) = (ClientIdentity::new("old"), ClientIdentity::new("new"));
    version("..2026_12_03_00_00_00.1", &old.ca_pem);
    std::os::unix::fs::symlink("..data/ca.crt", volume.join("ca.crt")).unwrap();
    let (server, server_ca) = start(dir.path(), Some(&volume.join("ca.crt"))).await;
    assert_denied_409(&answer(&server, &connector(&server_ca, Some(&old), rustls::DEFAULT_VERSIONS)).await);

    version("..2026_12_03_00_10_00.2", &new.ca_pem);
    wait_until_answered(&server, &server_ca, &new, true).await;
    wait_until_answered(&server, &server_ca, &old, false).await;

    // A bundle that does not load leaves the last good one in force.
    version("..2026_12_03_00_20_00.3", "not a certificate");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_denied_409(&answer(&server, &connector(&server_ca, Some(&new), rustls::DEFAULT_VERSIONS)).await);
    let without = connector(&server_ca, None, rustls::DEFAULT_VERSIONS);
    assert_refused(server.tls, &without, "CertificateRequired", "after a broken bundle").await;
    // Both CAs in one bundle: both trusted.
    version("..2026_12_03_00_30_00.4", &format!("{}{}", old.ca_pem, new.ca_pem));
    wait_until_answered(&server, &server_ca, &old, true).await;
    assert_denied_409(&answer(&server, &connector(&server_ca, Some(&new), rustls::DEFAULT_VERSIONS)).await);
}

#[tokio::test]
async fn the_binary_logs_whether_callers_are_authenticated_and_refuses_a_missing_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let apiserver = ClientIdentity::new("kube-apiserver");
    let ca_file = client_ca_file(dir.path(), &apiserver);

    let open = tempfile::tempdir().unwrap();
    let unauthenticated = BinaryServer::start(open.path(), &[], &[]).await;
    unauthenticated.wait_ready().await;
    // Through the environment twin, as the chart's users may set it.
    let authenticated = BinaryServer::start(dir.path(), &[], &[("STATUSGUARD_CLIENT_CA_FILE", &ca_file)]).await;
    authenticated.wait_ready().await;
    let server_ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let addr = ([127, 0, 0, 1], authenticated.tls).into();
    let without = connector(&server_ca, None, rustls::DEFAULT_VERSIONS);
    assert_refused(
        addr,
        &without,
        "CertificateRequired",
        "the binary, without a certificate",
    )
    .await;
    let answered = exchange(
        addr,
        &connector(&server_ca, Some(&apiserver), rustls::DEFAULT_VERSIONS),
        "/validate",
        &stale_review(),
    )
    .await;
    assert_denied_409(&answered);

    let serving_line = |log: String| {
        log.lines()
            .find(|l| l.contains("statusguard serving"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no start-up line in {log}"))
    };
    let line = serving_line(authenticated.log());
    assert!(
        line.contains("\"callers\":\"authenticated") && line.contains("client-ca.crt"),
        "{line}"
    );
    let line = serving_line(unauthenticated.log());
    assert!(line.contains("\"callers\":\"unauthenticated"), "{line}");

    let missing = tempfile::tempdir().unwrap();
    let mut broken = BinaryServer::start(missing.path(), &["--client-ca-file", "/nonexistent/ca.crt"], &[]).await;
    let status = tokio::task::spawn_blocking(move || broken.process.0.wait().unwrap())
        .await
        .unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(missing.path().join("serve.log")).unwrap();
    assert!(log.contains("/nonexistent/ca.crt"), "the error names the file: {log}");
}

/// The stale write of the example, padded with white space after it to 40 KB:
/// more than two frames of the protocol's 16 KiB.
fn review_of_40_kb() -> Vec<u8> {
    let mut body = stale_review();
    body.resize(40_000, b' ');
    body
}

/// A frame over the connection's largest ended it: the server's GOAWAY
/// says `FRAME_SIZE_ERROR`, unless the reset of the connection it closed
/// came before the GOAWAY could be read.
fn assert_refused_for_its_size(outcome: OneFrame) {
    const FRAME_SIZE_ERROR: u32 = 0x6;
    assert!(
        matches!(outcome, OneFrame::GoneAway(FRAME_SIZE_ERROR) | OneFrame::Cut),
        "a frame over 16 KiB ends the connection: {outcome:?}"
    );
}

/// The API server's HTTP/2 client (Go's) sends a body in frames as large as
/// the server allows. A caller whose certificate the server verified may
/// send a review in one frame of up to 64 KiB on the first HTTP/2
/// connections (the wide ones); past them, frames stay at 16 KiB.
#[tokio::test]
async fn a_verified_http2_caller_may_send_a_review_in_one_large_frame() {
    use statusguard::server::limits::{H2_MAX_FRAME, H2_VERIFIED_MAX_FRAME, H2_WIDE_CONNECTIONS};
    let dir = tempfile::tempdir().unwrap();
    let apiserver = ClientIdentity::new("kube-apiserver");
    let (server, server_ca) = start(dir.path(), Some(&client_ca_file(dir.path(), &apiserver))).await;
    let verified = h2_connector(&server_ca, Some(&apiserver));

    let (max_frame, answer) = post_in_one_frame(server.tls, &verified, &review_of_40_kb()).await;
    assert_eq!(max_frame, H2_VERIFIED_MAX_FRAME);
    let OneFrame::Answered(answer) = answer else {
        panic!("a 40 KB frame is read on a verified wide connection: {answer:?}");
    };
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 409);

    // Every wide connection held, each once served (so that it holds its place).
    let mut held = Vec::new();
    for _ in 0..H2_WIDE_CONNECTIONS {
        let (client, driver) = http2_connection(&verified, server.tls).await;
        let mut client = client.ready().await.unwrap();
        let request = http::Request::get("https://localhost/healthz").body(()).unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        response.await.unwrap();
        held.push((client, driver));
    }
    let (max_frame, answer) = post_in_one_frame(server.tls, &verified, &review_of_40_kb()).await;
    assert_eq!(max_frame, H2_MAX_FRAME, "past the wide connections");
    assert_refused_for_its_size(answer);
    for (_, driver) in held {
        driver.abort();
    }
}

/// Without a verified certificate, a wide connection keeps the protocol's
/// 16 KiB frames: h2 holds a frame whole until it has arrived.
#[tokio::test]
async fn an_unverified_http2_caller_keeps_the_protocols_frames() {
    use statusguard::server::limits::H2_MAX_FRAME;
    let dir = tempfile::tempdir().unwrap();
    let (server, server_ca) = start(dir.path(), None).await;
    let (max_frame, answer) = post_in_one_frame(server.tls, &h2_connector(&server_ca, None), &review_of_40_kb()).await;
    assert_eq!(max_frame, H2_MAX_FRAME);
    assert_refused_for_its_size(answer);
}
