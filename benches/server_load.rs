//! statusguard against the null webhook, measured in one run: the server's
//! own CPU per review (from `/proc/<pid>/stat`), reviews/s and latency, with
//! the server pinned to core 0 and the load generator (h2load) to core 1.
//!
//!     cargo bench --bench server_load                    # the main comparison
//!     LOAD_SWEEP=size cargo bench --bench server_load    # 1 KB .. 1 MiB reviews
//!     LOAD_SWEEP=rules cargo bench --bench server_load   # 1 .. 10,000 resources, 1 .. 1,000 writers
//!     LOAD_SWEEP=paced cargo bench --bench server_load   # only the paced rows (h2load, Go's client)
//!     LOAD_SWEEP=fixture cargo bench --bench server_load # the main comparison without the paced rows
//!     LOAD_SWEEP=observe cargo bench --bench server_load # the observer off, at its default rate, at every write
//!     LOAD_SWEEP=gateway cargo bench --bench server_load # an HTTPRoute with 32 parents of 8 conditions each
//!     LOAD_SWEEP=owned cargo bench --bench server_load   # the review with its 120 endpoints owned (by alice)
//!     LOAD_SWEEP=owned-size cargo bench --bench server_load # 3 KB .. 1 MiB reviews, endpoints owned
//!     LOAD_SECONDS=20 cargo bench --bench server_load    # longer runs (default 10 s)
//!
//! Needs `h2load` (Debian: nghttp2-client) and `taskset` (util-linux); Go, for
//! the row driven by Go's own HTTP/2 client (`benches/go-client`, the client
//! kube-apiserver calls webhooks with), which is left out, with a line
//! saying so, where Go is missing. Each
//! server runs as its own process: statusguard is the real binary, the null
//! webhook is this executable run with `--serve-null` (the same rustls, hyper
//! and axum stack and accept loop, answering a constant without parsing).
//! Each statusguard row also gives its mean time in the decision over the
//! run, from its own `statusguard_admission_duration_seconds` (read on its
//! admin port before and after, outside the CPU window): what of its CPU per
//! review is the decision, and what is the rest (the stack, the metrics,
//! waking the load generator).
//!
//! The first lines say how the machine's idle cores wait. On a VM guest
//! whose idle cores halt at once (cpuidle `haltpoll` with
//! `guest_halt_poll_ns` 0), the send that wakes an idle h2load costs the
//! sender an IPI, several µs in the sender's CPU; only the slower server
//! pays it, since h2load never idles against the faster one. Bare metal's
//! idle (`mwait`) is woken by a store, and so is a halt-polling guest's:
//!
//!     echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns  # as root; 0 to restore

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

type Error = Box<dyn std::error::Error>;

/// The allocator the statusguard binary runs on, so that the null webhook
/// (this executable) differs from it only in what it does with a review.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// How this machine's idle cores wait (see the module's documentation).
fn idle_policy() -> String {
    let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned()).ok();
    match read("/sys/devices/system/cpu/cpuidle/current_driver") {
        Some(driver) if driver == "haltpoll" => {
            let poll = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").unwrap_or_else(|| "?".to_owned());
            format!("cpuidle haltpoll, guest_halt_poll_ns {poll}")
        }
        Some(driver) => format!("cpuidle {driver}"),
        None => "cpuidle unknown".to_owned(),
    }
}

/// The null webhook, when this executable is run as the server.
fn serve_null(port: u16, cert: &Path, key: &Path) -> Result<(), Error> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let files = statusguard::cluster::certs::files::CertFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
        };
        let (key, _) = files.load()?;
        let resolver = statusguard::cluster::certs::tls::SwappableCert::new(key);
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(
            statusguard::cluster::certs::tls::server_config(resolver)?,
        ));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let limits = statusguard::server::http::accept::AcceptLimits::of(&Default::default());
        statusguard::server::http::accept::serve_tls(
            listener,
            acceptor,
            common::null_router(),
            limits,
            std::future::pending(),
        )
        .await;
        Ok::<(), Error>(())
    })
}

/// A server process, pinned to core 0, killed when dropped.
struct ServerProcess {
    child: Child,
    port: u16,
    /// statusguard's admin port, where its own metrics are read.
    admin: Option<u16>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    fn start(kind: &str, dir: &Path, rules: &Path, server_args: &[&str]) -> Result<Self, Error> {
        let port = free_port()?;
        // statusguard has an admin port, where its own metrics are read.
        let admin = match kind {
            "null" => None,
            _ => Some(free_port()?),
        };
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let mut command = Command::new("taskset");
        command.args(["-c", "0"]);
        match admin {
            None => {
                command
                    .arg(std::env::current_exe()?)
                    .arg("--serve-null")
                    .arg(port.to_string())
                    .arg(&cert)
                    .arg(&key);
            }
            Some(admin) => {
                command
                    .arg(env!("CARGO_BIN_EXE_statusguard"))
                    .arg("serve")
                    .arg("--ownership")
                    .arg(rules)
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
                    .arg("--tls-cert")
                    .arg(&cert)
                    .arg("--tls-key")
                    .arg(&key)
                    .args(["--log-level", "warn"])
                    .args(server_args);
            }
        }
        let child = command.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn()?;
        let server = Self { child, port, admin };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("the {kind} server did not listen on {port}").into())
    }

    /// utime + stime of the whole process, in seconds.
    fn cpu_seconds(&self) -> Result<f64, Error> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // The fields after the command name, which may hold spaces.
        let rest = stat.rsplit_once(')').ok_or("no ')' in /proc/PID/stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 of stat(5) are the 12th and 13th after the name.
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / clock_ticks()?)
    }

    /// statusguard's own account of its decisions so far: the sum (seconds)
    /// and count of `statusguard_admission_duration_seconds` on its admin
    /// port, over every endpoint. `None` for the null webhook.
    fn decisions(&self) -> Result<Option<(f64, f64)>, Error> {
        use std::io::{Read as _, Write as _};
        let Some(admin) = self.admin else {
            return Ok(None);
        };
        let mut connection = std::net::TcpStream::connect(("127.0.0.1", admin))?;
        connection.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        connection.read_to_string(&mut text)?;
        let (mut sum, mut count) = (0.0, 0.0);
        for line in text.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let name = name.split('{').next().unwrap_or_default();
            match name {
                "statusguard_admission_duration_seconds_sum" => sum += value.parse::<f64>()?,
                "statusguard_admission_duration_seconds_count" => count += value.parse::<f64>()?,
                _ => {}
            }
        }
        Ok(Some((sum, count)))
    }

    fn rss_kib(&self) -> Result<u64, Error> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or("no VmRSS")?;
        Ok(line.split_whitespace().nth(1).ok_or("no VmRSS value")?.parse()?)
    }
}

/// Builds `benches/go-client` (standard library only) into `dir`.
fn go_client(dir: &Path) -> Result<&'static Path, Error> {
    let out = dir.join("go-client");
    let status = Command::new("go")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/go-client"))
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .status()
        .map_err(|e| format!("cannot run go: {e}"))?;
    if !status.success() {
        return Err("go build of benches/go-client failed".into());
    }
    Ok(Box::leak(out.into_boxed_path()))
}

fn clock_ticks() -> Result<f64, Error> {
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How h2load drives the server.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// HTTP/1.1 keep-alive, one request at a time per connection.
    Http1 { connections: u32 },
    /// HTTP/2, `streams` requests in flight per connection.
    Http2 { connections: u32, streams: u32 },
    /// HTTP/2, one connection, one stream, a fixed rate: latency as the API server sees it.
    Paced { rate: u32 },
    /// The same, sent by Go's HTTP/2 client (`benches/go-client`): the
    /// client the API server itself calls webhooks with.
    GoPaced { rate: u32, client: &'static Path },
}

impl Load {
    fn label(self) -> String {
        match self {
            Load::Http1 { connections } => format!("HTTP/1.1, {connections} connections"),
            Load::Http2 { connections, streams } => format!("HTTP/2, {connections} connections x {streams} streams"),
            Load::Paced { rate } => format!("HTTP/2, 1 connection, {rate} reviews/s"),
            Load::GoPaced { rate, .. } => format!("Go HTTP/2 client, 1 conn., {rate}/s"),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    per_second: f64,
    cpu_per_review_us: f64,
    p50_ms: f64,
    p99_ms: f64,
    failed: f64,
    rss_mib: f64,
    /// statusguard's mean time in the decision over the run, by its own
    /// histogram: the part of the CPU per review that is not the stack.
    decision_us: Option<f64>,
}

fn run(
    server: &ServerProcess,
    body: &Path,
    path: &str,
    load: Load,
    seconds: u64,
    dir: &Path,
) -> Result<Measured, Error> {
    let log = dir.join("h2load.log");
    let url = format!("https://127.0.0.1:{}{path}", server.port);
    let mut command = Command::new("taskset");
    command.args(["-c", "1"]);
    if let Load::GoPaced { rate, client } = load {
        // Same log and count formats as h2load's.
        command
            .arg(client)
            .args([
                "-url",
                &url,
                "-rate",
                &rate.to_string(),
                "-seconds",
                &seconds.to_string(),
            ])
            .arg("-body")
            .arg(body)
            .arg("-log")
            .arg(&log);
    } else {
        command
            .arg("h2load")
            .args(["-D", &seconds.to_string()])
            .arg("-d")
            .arg(body)
            .args(["-H", "content-type: application/json"])
            .arg("--log-file")
            .arg(&log);
        match load {
            Load::Http1 { connections } => command.args(["--h1", "-c", &connections.to_string(), "-m", "1"]),
            Load::Http2 { connections, streams } => {
                command.args(["-c", &connections.to_string(), "-m", &streams.to_string()])
            }
            Load::Paced { rate } | Load::GoPaced { rate, .. } => {
                command.args(["-c", "1", "-m", "1", "--rps", &rate.to_string()])
            }
        };
        command.arg(url);
    }
    // A figure that cannot be read is left out ("?"), not a reason to stop the sweep.
    let decisions_before = server.decisions().ok().flatten();
    let before = server.cpu_seconds()?;
    let output = command.output()?;
    let after = server.cpu_seconds()?;
    let decision_us = match (decisions_before, server.decisions().ok().flatten()) {
        (Some((sum_before, count_before)), Some((sum, count))) if count > count_before => {
            Some((sum - sum_before) / (count - count_before) * 1e6)
        }
        _ => None,
    };
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("h2load failed: {text}{}", String::from_utf8_lossy(&output.stderr)).into());
    }
    let field = |prefix: &str, word: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(prefix))?;
        let parts: Vec<&str> = line.split([' ', ',']).filter(|s| !s.is_empty()).collect();
        let at = parts.iter().position(|p| *p == word)?;
        parts.get(at.checked_sub(1)?)?.parse().ok()
    };
    let succeeded = field("requests:", "succeeded").ok_or_else(|| format!("no request count in:\n{text}"))?;
    let failed = field("requests:", "failed").unwrap_or(0.0) + field("requests:", "errored").unwrap_or(0.0);
    // The log: start time, status, duration (µs), per request.
    let mut latencies: Vec<f64> = std::fs::read_to_string(&log)?
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.trim().parse::<f64>().ok())
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pick = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
            / 1e3
    };
    // The CPU window is the whole h2load run: every request it sent.
    let answered = succeeded + failed;
    Ok(Measured {
        per_second: succeeded / seconds as f64,
        cpu_per_review_us: (after - before) / answered.max(1.0) * 1e6,
        p50_ms: pick(0.50),
        p99_ms: pick(0.99),
        failed,
        rss_mib: server.rss_kib()? as f64 / 1024.0,
        decision_us,
    })
}

struct Bench {
    dir: tempfile::TempDir,
    seconds: u64,
}

impl Bench {
    fn new(seconds: u64) -> Result<Self, Error> {
        let dir = tempfile::tempdir()?;
        let certs = statusguard::cluster::certs::policy::generate_certificates(&[])?;
        std::fs::write(dir.path().join("tls.crt"), &certs.cert_pem)?;
        std::fs::write(dir.path().join("tls.key"), &certs.key_pem)?;
        Ok(Self { dir, seconds })
    }

    fn file(&self, name: &str, content: &[u8]) -> Result<PathBuf, Error> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content)?;
        Ok(path)
    }

    /// statusguard and the null webhook on the same load; prints a row each and the ratio.
    fn compare(
        &self,
        what: &str,
        rules: &Path,
        body: &Path,
        path: &str,
        loads: &[Load],
    ) -> Result<Vec<(Load, Measured, Measured)>, Error> {
        self.compare_with(what, rules, &[], body, path, loads)
    }

    /// [`Bench::compare`], with extra arguments to `statusguard serve`.
    fn compare_with(
        &self,
        what: &str,
        rules: &Path,
        server_args: &[&str],
        body: &Path,
        path: &str,
        loads: &[Load],
    ) -> Result<Vec<(Load, Measured, Measured)>, Error> {
        let mut results = Vec::new();
        let null = ServerProcess::start("null", self.dir.path(), rules, &[])?;
        let guard = ServerProcess::start("statusguard", self.dir.path(), rules, server_args)?;
        let idle_rss = guard.rss_kib()? as f64 / 1024.0;
        for &load in loads {
            let n = run(&null, body, path, load, self.seconds, self.dir.path())?;
            let s = run(&guard, body, path, load, self.seconds, self.dir.path())?;
            println!(
                "{what:<34} {:<36} null {:>7.0}/s {:>6.1} µs CPU p50 {:>5.2} p99 {:>5.2} ms | statusguard {:>7.0}/s {:>6.1} µs CPU (decision {}) p50 {:>5.2} p99 {:>5.2} ms rss {:>4.1} MiB (idle {:.1}) failed {} | CPU ratio {:.2}",
                load.label(),
                n.per_second,
                n.cpu_per_review_us,
                n.p50_ms,
                n.p99_ms,
                s.per_second,
                s.cpu_per_review_us,
                s.decision_us.map_or_else(|| "?".to_owned(), |us| format!("{us:.1} µs")),
                s.p50_ms,
                s.p99_ms,
                s.rss_mib,
                idle_rss,
                s.failed + n.failed,
                s.cpu_per_review_us / n.cpu_per_review_us,
            );
            results.push((load, n, s));
        }
        Ok(results)
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--serve-null") {
        let port: u16 = args.get(at + 1).ok_or("--serve-null PORT CERT KEY")?.parse()?;
        let cert = PathBuf::from(args.get(at + 2).ok_or("no CERT")?);
        let key = PathBuf::from(args.get(at + 3).ok_or("no KEY")?);
        return serve_null(port, &cert, &key);
    }
    // `cargo test --benches` runs this without --bench: nothing to measure then.
    if !args.iter().any(|a| a == "--bench") {
        println!("server_load: run with `cargo bench --bench server_load`");
        return Ok(());
    }
    for tool in ["h2load", "taskset"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Err(format!("server_load needs {tool} (Debian: apt-get install nghttp2-client util-linux)").into());
        }
    }
    let bench = Bench::new(env_or("LOAD_SECONDS", 10))?;
    let default_rules = bench.file(
        "ownership.yaml",
        common::ownership().replace("mode: trim", "mode: enforce").as_bytes(),
    )?;
    let trim_rules = bench.file("ownership-trim.yaml", common::ownership().as_bytes())?;
    let stale = bench.file("stale.json", &common::review(true))?;
    println!("review: {} bytes", std::fs::metadata(&stale)?.len());
    println!("idle cores: {}", idle_policy());
    let h1 = Load::Http1 { connections: 8 };
    let h2 = Load::Http2 {
        connections: 4,
        streams: 8,
    };
    match std::env::var("LOAD_SWEEP").unwrap_or_default().as_str() {
        "size" => {
            for bytes in [1 << 10, 35 << 10, 256 << 10, 1 << 20] {
                let review = common::review_shaped(true, common::Shape::sized(bytes));
                let body = bench.file(&format!("review-{bytes}.json"), &review)?;
                bench.compare(
                    &format!("/validate, {} bytes", review.len()),
                    &default_rules,
                    &body,
                    "/validate",
                    &[h1],
                )?;
            }
        }
        "owned-size" => {
            // Issue 25: the size sweep with the values owned, `endpoints` (all
            // but about 24 KB of each review above 4 KB) owned by a fourth
            // writer and unchanged by the stale write, which is denied for
            // the scaler's fields.
            let owned = common::ownership_endpoints_owned().replace("mode: trim", "mode: enforce");
            let owned = bench.file("owned-size-enforce.yaml", owned.as_bytes())?;
            for bytes in [3 << 10, 35 << 10, 256 << 10, 1 << 20] {
                let review = common::review_shaped(true, common::Shape::sized(bytes));
                let body = bench.file(&format!("owned-review-{bytes}.json"), &review)?;
                bench.compare(
                    &format!("/validate, {} bytes, endpoints owned", review.len()),
                    &owned,
                    &body,
                    "/validate",
                    &[h1],
                )?;
                // The observer's share: it copies the statuses of up to
                // 200 writes a second and diffs them on a thread of its own.
                bench.compare_with(
                    &format!("/validate, {} bytes, endpoints owned, observer off", review.len()),
                    &owned,
                    &["--observe-rate", "0"],
                    &body,
                    "/validate",
                    &[h1],
                )?;
            }
        }
        "rules" => {
            for (resources, writers) in [(1, 4), (10_000, 4), (1, 1), (1, 1000)] {
                let rules = bench.file(
                    &format!("rules-{resources}-{writers}.yaml"),
                    common::ownership_scaled(resources, writers).as_bytes(),
                )?;
                bench.compare(
                    &format!("{resources} resources, {writers} writers"),
                    &rules,
                    &stale,
                    "/validate",
                    &[h1],
                )?;
            }
        }
        "gateway" => {
            // examples/gateway-api.yaml on an HTTPRoute of 32 parents (16 per
            // implementation), 8 conditions each: one implementation's update
            // of its own entries (allowed), and its stale retry that rolls
            // back the other's (denied; restored in trim).
            let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
            let document = std::fs::read_to_string(examples.join("gateway-api.yaml"))?;
            let enforce = bench.file("gateway-enforce.yaml", document.as_bytes())?;
            let trim = bench.file(
                "gateway-trim.yaml",
                document.replace("mode: enforce", "mode: trim").as_bytes(),
            )?;
            let own = examples.join("gateway-route-review.json");
            let stale = examples.join("gateway-route-stale-review.json");
            println!("route review: {} bytes", std::fs::metadata(&stale)?.len());
            bench.compare("route, own entries (allowed)", &enforce, &own, "/validate", &[h1, h2])?;
            bench.compare("route, stale retry (denied)", &enforce, &stale, "/validate", &[h1, h2])?;
            bench.compare("route, stale retry (trim: patch)", &trim, &stale, "/mutate", &[h1, h2])?;
        }
        "owned" => {
            // Issue 25: the same review, its `endpoints` (120 entries, the
            // largest value of the status) owned by a fourth writer and
            // unchanged by the write.
            let owned = common::ownership_endpoints_owned();
            let enforce = bench.file(
                "owned-enforce.yaml",
                owned.replace("mode: trim", "mode: enforce").as_bytes(),
            )?;
            let trim = bench.file("owned-trim.yaml", owned.as_bytes())?;
            bench.compare(
                "/validate, endpoints owned (denied)",
                &enforce,
                &stale,
                "/validate",
                &[h1, h2],
            )?;
            bench.compare("/mutate, endpoints owned (trim)", &trim, &stale, "/mutate", &[h1, h2])?;
        }
        "observe" => {
            // The observer re-reads each write it takes (`--observe-rate`
            // per second at most): off, at its default, and at every write of
            // the paced load.
            for (what, rate) in [
                ("observer off (--observe-rate 0)", "0"),
                ("observer at its default, 200/s", "200"),
                ("observer on every write, 1000/s", "1000"),
            ] {
                bench.compare_with(
                    what,
                    &default_rules,
                    &["--observe-rate", rate],
                    &stale,
                    "/validate",
                    &[h1, Load::Paced { rate: 1000 }],
                )?;
            }
        }
        sweep => {
            if sweep != "paced" {
                bench.compare(
                    "/validate (enforce: denied)",
                    &default_rules,
                    &stale,
                    "/validate",
                    &[h1, h2],
                )?;
                bench.compare("/mutate (trim: patch)", &trim_rules, &stale, "/mutate", &[h1, h2])?;
            }
            // `fixture`: the two rows above alone.
            if sweep == "fixture" {
                return Ok(());
            }
            let mut paced = vec![Load::Paced { rate: 1000 }];
            match go_client(bench.dir.path()) {
                Ok(client) => paced.push(Load::GoPaced { rate: 1000, client }),
                Err(e) => println!("the Go-client row is not measured: {e}"),
            }
            bench.compare(
                "/validate (enforce: denied)",
                &default_rules,
                &stale,
                "/validate",
                &paced,
            )?;
        }
    }
    Ok(())
}
