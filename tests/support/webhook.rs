//! Starting the real webhook server on loopback, and real TLS clients for it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use statusguard::cluster::certs::files::CertFiles;
use statusguard::cluster::certs::policy::{GeneratedCertificates, generate_certificates};
use statusguard::rules::RulesSource;
use statusguard::server::Server;
use statusguard::server::config::{CertSource, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_rustls::TlsConnector;

// Re-exported for the tests that wait on a server; not every test binary uses both.
#[allow(unused_imports)]
pub use super::wait::{eventually, free_port};

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub fn config(rules: RulesSource, tls_files: Option<CertFiles>) -> ServeConfig {
    ServeConfig {
        rules,
        listen: loopback(),
        admin_listen: loopback(),
        certs: tls_files.map_or(
            CertSource::Generated {
                sans: vec![],
                write_ca: None,
            },
            CertSource::Files,
        ),
        tls_reload_interval: Duration::from_millis(200),
        limits: Default::default(),
        client_ca_file: None,
        shutdown_timeout: Duration::from_secs(10),
        shutdown_delay: Duration::ZERO,
        registration: None,
        policy_registration: None,
        observe: Default::default(),
    }
}

/// A server running in this process until dropped.
pub struct RunningServer {
    pub tls: SocketAddr,
    pub admin: SocketAddr,
    pub app: Arc<statusguard::server::state::App>,
    stop: Option<oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    pub async fn start(config: ServeConfig) -> Self {
        let server = Server::bind(config).await.expect("the server binds");
        let (tls, admin, app) = (server.tls_addr(), server.admin_addr(), server.app());
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Self {
            tls,
            admin,
            app,
            stop: Some(stop),
            done: Some(done),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.tls.port())
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// The admin port's answer at `path`.
    pub async fn admin_text(&self, path: &str) -> String {
        plain_client()
            .get(self.admin_url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The admin port's /metrics text.
    pub async fn metrics(&self) -> String {
        self.admin_text("/metrics").await
    }

    /// The admin port's record of observed writes (`GET /observed`).
    pub async fn observed(&self) -> serde_json::Value {
        serde_json::from_str(&self.admin_text("/observed").await).unwrap()
    }

    /// Starts the graceful shutdown; `done` finishes when it has drained.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A certificate pair written to `dir` (tls.crt, tls.key) and its CA.
pub fn write_pair(dir: &Path) -> GeneratedCertificates {
    let certs = generate_certificates(&[]).unwrap();
    std::fs::write(dir.join("tls.crt"), &certs.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &certs.key_pem).unwrap();
    certs
}

pub fn files(dir: &Path) -> CertFiles {
    CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    }
}

/// An HTTPS client that trusts only `ca_pem`.
pub fn https_client(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

pub fn plain_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// A TLS connector that trusts only `ca_pem` and offers `versions`.
pub fn tls_connector(ca_pem: &str, versions: &[&'static rustls::SupportedProtocolVersion]) -> TlsConnector {
    super::mtls::connector(ca_pem, None, versions)
}

/// A TLS connector that offers HTTP/2 alone in its handshake (ALPN `h2`), as
/// the API server's client does.
pub fn h2_tls_connector(ca_pem: &str) -> TlsConnector {
    super::mtls::h2_connector(ca_pem, None)
}

/// A TLS connection through `connector` to the server at `addr` (named
/// `localhost` in its certificate).
pub async fn tls_connected(connector: &TlsConnector, addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// An HTTP/2 connection (ALPN `h2`) and the task that drives it.
pub async fn http2_connection(
    connector: &TlsConnector,
    addr: SocketAddr,
) -> (h2::client::SendRequest<bytes::Bytes>, tokio::task::JoinHandle<()>) {
    let tls = tls_connected(connector, addr).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (client, connection) = h2::client::handshake(tls).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driver)
}

/// One HTTP/2 frame as it came: its type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// A frame's nine-byte header.
fn frame_head(kind: u8, flags: u8, stream: u32, length: usize) -> Vec<u8> {
    let length = u32::try_from(length).unwrap().to_be_bytes();
    let mut head = vec![length[1], length[2], length[3], kind, flags];
    head.extend_from_slice(&stream.to_be_bytes());
    head
}

/// `bytes` written and flushed, or why not.
pub async fn sent(tls: &mut (impl AsyncWriteExt + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    tls.write_all(bytes).await?;
    tls.flush().await
}

async fn write_frame(tls: &mut (impl AsyncWriteExt + Unpin), kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let mut frame = frame_head(kind, flags, stream, payload.len());
    frame.extend_from_slice(payload);
    sent(tls, &frame).await.unwrap();
}

/// The next frame, or `None` once the server has closed the connection.
async fn read_frame(tls: &mut (impl AsyncReadExt + Unpin)) -> Option<Frame> {
    let mut head = [0; 9];
    tls.read_exact(&mut head).await.ok()?;
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; length];
    tls.read_exact(&mut payload).await.ok()?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream,
        payload,
    })
}

/// `name: value` as an HPACK literal without indexing, with a new name (no
/// Huffman coding).
fn literal_header(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0x00);
    for text in [name, value] {
        let length = u8::try_from(text.len()).unwrap();
        assert!(length < 0x7f, "one-byte lengths only");
        block.push(length);
        block.extend_from_slice(text.as_bytes());
    }
}

/// What became of a request sent by [`post_in_one_frame`].
#[derive(Debug)]
pub enum OneFrame {
    /// The review's answer.
    Answered(serde_json::Value),
    /// A GOAWAY with this error code ended the connection.
    GoneAway(u32),
    /// The connection was cut before a GOAWAY could be read: a server that
    /// refuses a frame from its header closes while the rest of it is still
    /// being written, and the reset may come first.
    Cut,
}

/// Posts `body` to `/validate` as a single DATA frame, on an HTTP/2
/// connection of its own through `connector` (which offers ALPN `h2`),
/// written frame by frame: the largest frame the server's SETTINGS allow,
/// and what became of the request.
pub async fn post_in_one_frame(addr: SocketAddr, connector: &TlsConnector, body: &[u8]) -> (u32, OneFrame) {
    let mut tls = tls_connected(connector, addr).await;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    write_frame(&mut tls, SETTINGS, 0, 0, &[]).await;
    // The protocol's initial largest frame, unless the server says otherwise.
    let mut max_frame = 16 * 1024;
    loop {
        let frame = read_frame(&mut tls).await.expect("the server's SETTINGS");
        if frame.kind == SETTINGS && frame.flags & ACK == 0 {
            for setting in frame.payload.chunks_exact(6) {
                if u16::from_be_bytes([setting[0], setting[1]]) == SETTINGS_MAX_FRAME_SIZE {
                    max_frame = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                }
            }
            write_frame(&mut tls, SETTINGS, ACK, 0, &[]).await;
            break;
        }
    }
    let mut headers = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/validate"),
        (":authority", "localhost"),
        ("content-type", "application/json"),
    ] {
        literal_header(&mut headers, name, value);
    }
    write_frame(&mut tls, HEADERS, END_HEADERS, 1, &headers).await;
    // The whole DATA frame in one write; if the server has closed, what it
    // sent first is still read below.
    let mut data = frame_head(DATA, END_STREAM, 1, body.len());
    data.extend_from_slice(body);
    let _ = sent(&mut tls, &data).await;
    let mut answer = Vec::new();
    while let Some(frame) = read_frame(&mut tls).await {
        match frame.kind {
            GOAWAY => {
                let code = u32::from_be_bytes([frame.payload[4], frame.payload[5], frame.payload[6], frame.payload[7]]);
                return (max_frame, OneFrame::GoneAway(code));
            }
            // `:status: 200`, the static table's entry 8.
            HEADERS if frame.stream == 1 => assert_eq!(frame.payload.first(), Some(&0x88), "answered 200"),
            DATA if frame.stream == 1 => {
                answer.extend_from_slice(&frame.payload);
                if frame.flags & END_STREAM != 0 {
                    return (max_frame, OneFrame::Answered(serde_json::from_slice(&answer).unwrap()));
                }
            }
            _ => {}
        }
    }
    (max_frame, OneFrame::Cut)
}

/// A raw HTTP/1.1 request over TLS whose body is sent in two parts, with
/// `between` run in the middle: an in-flight request under the test's control.
pub async fn split_request(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    body: &[u8],
    between: impl std::future::Future<Output = ()>,
) -> String {
    let mut tls = tls_connected(&tls_connector(ca_pem, rustls::DEFAULT_VERSIONS), addr).await;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let half = body.len() / 2;
    tls.write_all(&body[..half]).await.unwrap();
    tls.flush().await.unwrap();
    between.await;
    tls.write_all(&body[half..]).await.unwrap();
    tls.flush().await.unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

/// A child process, killed when dropped.
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `statusguard serve` binary on free loopback ports, with a generated
/// certificate whose CA is written to `dir/ca.pem`, logging JSON to `dir/serve.log`.
pub struct BinaryServer {
    pub process: Process,
    pub tls: u16,
    pub admin: u16,
    pub log: PathBuf,
}

impl BinaryServer {
    pub async fn start(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::start_on(free_port(), dir, args, env).await
    }

    /// On a given TLS port. Without `--tls-cert` in `args`, a certificate is
    /// generated and its CA written to `dir/ca.pem`.
    pub async fn start_on(tls: u16, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        Self::start_at(&format!("127.0.0.1:{tls}"), tls, dir, args, env).await
    }

    /// Listening on `listen` (whose port is `tls`), e.g. `[::]:PORT` as the
    /// chart's pods do; the admin port stays on loopback.
    pub async fn start_at(listen: &str, tls: u16, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Self {
        let admin = free_port();
        let log = dir.join("serve.log");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_statusguard"));
        command.args([
            "serve",
            "--listen",
            listen,
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ]);
        if !args
            .iter()
            .any(|a| a.starts_with("--tls-cert") || a.starts_with("--manage-certificates"))
        {
            command.arg("--write-ca").arg(dir.join("ca.pem"));
        }
        if !args.iter().any(|a| a.starts_with("--log-format")) {
            command.args(["--log-format", "json"]);
        }
        command
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (key, value) in env {
            command.env(key, value);
        }
        let process = Process(command.spawn().unwrap());
        Self {
            process,
            tls,
            admin,
            log,
        }
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    pub async fn get_admin(&self, path: &str) -> Option<(u16, String)> {
        let response = plain_client().get(self.admin_url(path)).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    pub async fn wait_ready(&self) {
        super::wait::retry_until(Duration::from_secs(30), "the binary is ready", || async {
            match self.get_admin("/readyz").await {
                Some((200, _)) => Ok(()),
                readyz => Err(format!("/readyz: {readyz:?}; its log:\n{}", self.log())),
            }
        })
        .await;
    }

    pub async fn metrics(&self) -> String {
        self.get_admin("/metrics")
            .await
            .map(|(_, text)| text)
            .unwrap_or_default()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Sends the signal `name` (TERM, KILL) to `child`.
pub fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// Asserts that `series` (as [`metric`] finds it) has `value`, showing the
/// whole exposition when it does not.
pub fn assert_metric(metrics: &str, series: &str, value: f64) {
    assert_eq!(metric(metrics, series), Some(value), "{series} in:\n{metrics}");
}

/// The value of one series (`name{labels}` exactly as exposed) in a
/// Prometheus text exposition.
pub fn metric(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}
