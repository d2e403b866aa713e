//! The command line: `serve`, `check`, `review`, `gen-certs`.
//! Every flag has a `STATUSGUARD_*` environment twin.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::decision::{Endpoint, decide};
use crate::ownership::Ownership;
use crate::review::{encode_response, parse_request};
use crate::server::{RulesSource, ServeConfig, Server, shutdown_signal};
use crate::tls::{CertFiles, generate_certificates};

#[derive(Debug, Parser)]
#[command(
    name = "statusguard",
    version,
    about = "Ownership of shared Kubernetes status fields"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "STATUSGUARD_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `statusguard=debug`.
    #[arg(long, global = true, default_value = "info", env = "STATUSGUARD_LOG_LEVEL")]
    pub log_level: String,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the serve variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the TLS admission webhook.
    Serve(ServeArgs),
    /// Validate an ownership document (or a ConfigMap manifest holding one).
    Check(CheckArgs),
    /// Answer one AdmissionReview offline, exactly as the server would.
    Review(ReviewArgs),
    /// Write a development CA and serving certificate (for --tls-cert/--tls-key).
    GenCerts(GenCertsArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The ownership document. Without it (and without --configmap) the
    /// embedded example document is used.
    #[arg(long, env = "STATUSGUARD_OWNERSHIP", conflicts_with = "configmap")]
    pub ownership: Option<PathBuf>,
    /// NAMESPACE/NAME of a ConfigMap whose key `ownership.yaml` holds the document (cluster mode).
    #[arg(long, env = "STATUSGUARD_CONFIGMAP", value_parser = parse_namespaced)]
    pub configmap: Option<(String, String)>,
    /// HTTPS address of /validate and /mutate.
    #[arg(long, default_value = "0.0.0.0:8443", env = "STATUSGUARD_LISTEN")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", env = "STATUSGUARD_ADMIN_LISTEN")]
    pub admin_listen: SocketAddr,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Largest request body accepted; larger ones get 413.
    #[arg(long, default_value_t = 16 * 1024 * 1024, env = "STATUSGUARD_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Time allowed for a client's TLS handshake and request headers.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "STATUSGUARD_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Duration,
    /// Time allowed for a request body (the API server waits at most 30 s for a webhook).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "STATUSGUARD_REQUEST_TIMEOUT")]
    pub request_timeout: Duration,
    /// After SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, default_value = "25s", value_parser = humantime::parse_duration, env = "STATUSGUARD_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Duration,
}

#[derive(Debug, Args)]
pub struct TlsArgs {
    /// PEM certificate chain, leaf first; re-read when it changes.
    #[arg(long, env = "STATUSGUARD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    #[arg(long, env = "STATUSGUARD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How often the certificate files are checked for a change.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, env = "STATUSGUARD_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Duration,
    /// Without --tls-cert: write the CA that verifies the generated certificate here.
    #[arg(long, env = "STATUSGUARD_WRITE_CA", conflicts_with = "tls_cert")]
    pub write_ca: Option<PathBuf>,
    /// Without --tls-cert: more names (DNS or IP) for the generated certificate.
    #[arg(long = "tls-san", env = "STATUSGUARD_TLS_SAN", value_delimiter = ',')]
    pub tls_sans: Vec<String>,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct CheckArgs {
    /// The ownership document, or a ConfigMap manifest with key `ownership.yaml`.
    #[arg(env = "STATUSGUARD_CHECK_FILE")]
    pub file: Option<PathBuf>,
    /// Check the live ConfigMap NAMESPACE/NAME instead, as the server would
    /// read it (in-cluster config, or KUBECONFIG).
    #[arg(long, env = "STATUSGUARD_CONFIGMAP", value_parser = parse_namespaced)]
    pub configmap: Option<(String, String)>,
}

#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// The ownership document (or a ConfigMap manifest holding it).
    #[arg(long, env = "STATUSGUARD_OWNERSHIP")]
    pub ownership: PathBuf,
    /// Which endpoint to answer as.
    #[arg(long, value_enum, default_value = "validate", env = "STATUSGUARD_ENDPOINT")]
    pub endpoint: EndpointArg,
    /// An AdmissionReview (admission.k8s.io/v1) as JSON; `-` reads standard input.
    pub review: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EndpointArg {
    Validate,
    Mutate,
}

#[derive(Debug, Args)]
pub struct GenCertsArgs {
    /// Folder to write ca.crt, tls.crt and tls.key into.
    #[arg(long, env = "STATUSGUARD_OUT_DIR")]
    pub out_dir: PathBuf,
    /// More names (DNS or IP) besides localhost, 127.0.0.1 and ::1.
    #[arg(long = "tls-san", env = "STATUSGUARD_TLS_SAN", value_delimiter = ',')]
    pub tls_sans: Vec<String>,
}

fn parse_namespaced(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
    }
}

impl ServeArgs {
    pub fn into_config(self) -> ServeConfig {
        let rules = match (self.ownership, self.configmap) {
            (Some(path), _) => RulesSource::File(path),
            (None, Some((namespace, name))) => RulesSource::ConfigMap { namespace, name },
            (None, None) => RulesSource::Embedded,
        };
        let tls_files = match (self.tls.tls_cert, self.tls.tls_key) {
            (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
            _ => None,
        };
        ServeConfig {
            rules,
            listen: self.listen,
            admin_listen: self.admin_listen,
            tls_files,
            tls_reload_interval: self.tls.tls_reload_interval,
            write_ca: self.tls.write_ca,
            tls_sans: self.tls.tls_sans,
            max_body_bytes: self.max_body_bytes,
            header_read_timeout: self.header_read_timeout,
            request_timeout: self.request_timeout,
            shutdown_timeout: self.shutdown_timeout,
        }
    }
}

/// Sets up logging to stderr in the chosen format.
pub fn init_logging(format: LogFormat, filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => {
            let server = Server::bind(args.into_config()).await?;
            server.run(shutdown_signal()).await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => Ok(check(&args).await),
        Command::Review(args) => Ok(review(&args)),
        Command::GenCerts(args) => {
            let certs = generate_certificates(&args.tls_sans)?;
            std::fs::create_dir_all(&args.out_dir)
                .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
            for (name, pem) in [
                ("ca.crt", &certs.ca_pem),
                ("tls.crt", &certs.cert_pem),
                ("tls.key", &certs.key_pem),
            ] {
                let path = args.out_dir.join(name);
                std::fs::write(&path, pem).with_context(|| format!("cannot write {}", path.display()))?;
            }
            print_out(&format!(
                "wrote ca.crt, tls.crt and tls.key to {}\n",
                args.out_dir.display()
            ));
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn check(args: &CheckArgs) -> ExitCode {
    let (origin, checked) = match (&args.file, &args.configmap) {
        (Some(file), _) => {
            let origin = file.display().to_string();
            match std::fs::read_to_string(file) {
                Ok(text) => (
                    origin,
                    Ownership::from_document_or_configmap(&text).map_err(|e| e.problems()),
                ),
                Err(e) => (origin, Err(vec![format!("cannot read: {e}")])),
            }
        }
        (None, Some((namespace, name))) => {
            let origin = format!("ConfigMap {namespace}/{name}");
            let checked = match kube::Client::try_default().await {
                Ok(client) => crate::configmap::fetch_ownership(client, namespace, name)
                    .await
                    .map_err(|e| match e {
                        crate::configmap::ConfigMapError::Invalid { source, .. } => source.problems(),
                        other => vec![other.to_string()],
                    }),
                Err(e) => Err(vec![format!("cannot reach the Kubernetes API: {e}")]),
            };
            (origin, checked)
        }
        (None, None) => unreachable_by_clap(),
    };
    match checked {
        Ok(rules) => {
            let mut text = format!("{origin}: valid: {}\n", rules.summary());
            for r in rules.resources() {
                text += &format!(
                    "  {} (mode {}, conditions at status.{})\n",
                    r.name(),
                    r.mode,
                    r.conditions_path
                );
                for w in &r.writers {
                    let fields: Vec<String> = w.fields.iter().map(ToString::to_string).collect();
                    text += &format!(
                        "    {}: fields [{}], conditions [{}]\n",
                        w.username,
                        fields.join(", "),
                        w.conditions.join(", ")
                    );
                }
            }
            if args.file.is_some() {
                text += &writer_hints(&rules).await;
            }
            print_out(&text);
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{origin}: invalid:");
            for problem in problems {
                eprintln!("  - {problem}");
            }
            ExitCode::from(1)
        }
    }
}

/// When a cluster is reachable (in-cluster config or KUBECONFIG), a hint for
/// every service-account writer that does not exist there: a misspelled
/// writer owns nothing the webhook will ever see. Silent when no cluster is
/// configured; never an error.
async fn writer_hints(rules: &Ownership) -> String {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let Ok(client) = kube::Client::try_default().await else {
        return String::new();
    };
    let mut accounts: Vec<(&str, &str)> = rules
        .resources()
        .iter()
        .flat_map(|r| &r.writers)
        .filter_map(|w| w.username.strip_prefix("system:serviceaccount:")?.split_once(':'))
        .collect();
    accounts.sort();
    accounts.dedup();
    let lookups = async {
        let mut hints = String::new();
        for (namespace, name) in accounts {
            let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    hints += &format!("  hint: ServiceAccount {namespace}/{name} does not exist in the cluster\n")
                }
                Err(e) => return format!("  (cluster hints skipped: {e})\n"),
            }
        }
        hints
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), lookups)
        .await
        .unwrap_or_else(|_| "  (cluster hints skipped: the cluster did not answer in 10 s)\n".to_owned())
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print_out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// clap's argument group requires exactly one of FILE and --configmap.
fn unreachable_by_clap() -> ! {
    eprintln!("statusguard check: give FILE or --configmap NAMESPACE/NAME");
    std::process::exit(2)
}

fn review(args: &ReviewArgs) -> ExitCode {
    match answer_review(args) {
        Ok(json) => {
            print_out(&format!("{json}\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("statusguard review: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn answer_review(args: &ReviewArgs) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(&args.ownership)
        .with_context(|| format!("cannot read {}", args.ownership.display()))?;
    let rules = Ownership::from_document_or_configmap(&text).with_context(|| args.ownership.display().to_string())?;
    let body = if args.review.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .context("cannot read standard input")?;
        body
    } else {
        std::fs::read(&args.review).with_context(|| format!("cannot read {}", args.review.display()))?
    };
    let request = parse_request(&body)?;
    let endpoint = match args.endpoint {
        EndpointArg::Validate => Endpoint::Validate,
        EndpointArg::Mutate => Endpoint::Mutate,
    };
    let decision = decide(&rules, &request, endpoint)?;
    Ok(String::from_utf8(encode_response(decision.response)?)?)
}
