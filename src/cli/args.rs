//! The arguments of every command, as clap reads them. Every flag of
//! `serve` has a `STATUSGUARD_*` environment twin.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValue;
use clap::{Args, Parser, Subcommand, ValueEnum};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::admission::decide::Endpoint;
use crate::cluster::certs::secret::SecretRef;
use crate::cluster::registration::desired::WebhookTarget;
use crate::ownership::FailurePolicy;
use crate::rules::ConfigMapRef;
use crate::server::limits;

/// `statusguard`'s arguments.
#[derive(Debug, Parser)]
#[command(
    name = "statusguard",
    version,
    about = "Ownership of shared Kubernetes status fields"
)]
pub struct Cli {
    /// What to do.
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

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, in colour on a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
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
    /// Remove statusguard's webhook configurations, and stand its servers down
    /// so that they do not apply them again: the recovery when statusguard is
    /// gone and guarded status writes fail.
    Unregister(UnregisterArgs),
    /// Call each registered webhook as the API server does (its Service name
    /// or URL, its caBundle) with a status write that changes nothing, and
    /// check the answer: the chart's `helm test`.
    Probe(ProbeArgs),
    /// Draft an ownership document from the cluster as it is: who sets which
    /// status items (managedFields, and the webhook's observed writes), and
    /// where more than one writer does.
    Suggest(SuggestArgs),
    /// Print the ownership document as something else the cluster can run.
    #[command(subcommand)]
    Export(ExportCommand),
}

/// `statusguard export`.
#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// ValidatingAdmissionPolicies and MutatingAdmissionPolicies (with their
    /// bindings) that decide as the webhook does, evaluated by the API
    /// server itself: no webhook at all. Deterministic YAML, for GitOps.
    Policies(ExportPoliciesArgs),
}

/// `statusguard export policies`.
#[derive(Debug, Args)]
pub struct ExportPoliciesArgs {
    /// The ownership document, or a ConfigMap manifest with key `ownership.yaml`.
    #[arg(long, env = "STATUSGUARD_OWNERSHIP", conflicts_with = "configmap")]
    pub ownership: Option<PathBuf>,
    /// Read the live ConfigMap NAMESPACE/NAME instead (in-cluster config, or KUBECONFIG).
    #[arg(long, env = "STATUSGUARD_CONFIGMAP")]
    pub configmap: Option<ConfigMapRef>,
    /// The first label of every object's name: `NAME.<resource>.<group>`.
    #[arg(long, default_value = "statusguard", value_parser = crate::policies::set_name)]
    pub name: String,
    /// Export even where the policies decide differently from the webhook
    /// (`statusguard check` lists where).
    #[arg(long)]
    pub allow_deviations: bool,
}

/// `statusguard serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The ownership document, or a ConfigMap manifest holding it. Without it
    /// (and without --configmap) the embedded example document is used.
    #[arg(long, env = "STATUSGUARD_OWNERSHIP", conflicts_with = "configmap")]
    pub ownership: Option<PathBuf>,
    /// NAMESPACE/NAME of a ConfigMap whose key `ownership.yaml` holds the document (cluster mode).
    #[arg(long, env = "STATUSGUARD_CONFIGMAP")]
    pub configmap: Option<ConfigMapRef>,
    /// HTTPS address of /validate and /mutate. `[::]` is dual stack (IPv4
    /// too; IPv4 only on a node without IPv6).
    #[arg(long, default_value = "[::]:8443", env = "STATUSGUARD_LISTEN")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /healthz, /readyz and /metrics (dual stack as --listen).
    #[arg(long, default_value = "[::]:8080", env = "STATUSGUARD_ADMIN_LISTEN")]
    pub admin_listen: SocketAddr,
    /// The serving certificate.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// What a caller can make the server hold, and how long it may take.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// After SIGTERM, how long readiness is 503 while connections are still
    /// accepted and served, before the server stops accepting and drains.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration, env = "STATUSGUARD_SHUTDOWN_DELAY")]
    pub shutdown_delay: Duration,
    /// After SIGTERM (and the delay), how long in-flight requests may take to finish.
    #[arg(long, default_value = "25s", value_parser = humantime::parse_duration, env = "STATUSGUARD_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Duration,
    /// How the server registers itself.
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    /// Certificates the server keeps itself.
    #[command(flatten)]
    pub managed_certs: ManagedCertArgs,
    /// What the server records of the status writes it sees, and the Events.
    #[command(flatten)]
    pub observe: ObserveArgs,
}

/// The bounds on what any caller of the TLS port can make the server hold
/// (see the README's "Security model").
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Largest request body accepted; larger ones get 413. The default holds
    /// the largest review the API server sends with etcd's default object
    /// limit (1.5 MiB); raise it with etcd's --max-request-bytes.
    #[arg(long, default_value_t = limits::DEFAULT_MAX_BODY_BYTES, env = "STATUSGUARD_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Request body bytes held at once, across all requests (reserved from
    /// Content-Length before a body is read); a request that finds no room
    /// within --request-timeout gets 429. At least --max-body-bytes.
    #[arg(long, default_value_t = 4 * limits::DEFAULT_MAX_BODY_BYTES, env = "STATUSGUARD_MAX_INFLIGHT_BYTES")]
    pub max_inflight_bytes: usize,
    /// Requests read or decided at once; as many more may wait for room
    /// (then get 429 after --request-timeout), and one past those gets 429 at once.
    #[arg(long, default_value_t = 256, env = "STATUSGUARD_MAX_INFLIGHT_REQUESTS")]
    pub max_inflight_requests: usize,
    /// TLS connections served at once; more wait in the listen backlog.
    #[arg(long, default_value_t = 512, env = "STATUSGUARD_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// Threads deciding large reviews (over 128 KiB) at once, off the async
    /// workers; default: the CPUs the process may use.
    #[arg(long, env = "STATUSGUARD_DECISION_THREADS")]
    pub decision_threads: Option<usize>,
    /// Time allowed from a connection's accept to its first request's headers,
    /// TLS handshake included, and (HTTP/1.1) for each next request's headers.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "STATUSGUARD_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Duration,
    /// Time allowed for a request to find room under the limits, and again
    /// for its body (the API server waits at most 30 s for a webhook).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "STATUSGUARD_REQUEST_TIMEOUT")]
    pub request_timeout: Duration,
}

/// The observer of status writes (`GET /observed` on the admin port) and
/// the Events of denied and trimmed writes.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    /// Status writes of guarded resources read per second at most, off the
    /// request path (which identity changed which items); 0: none.
    #[arg(long, default_value_t = 200, env = "STATUSGUARD_OBSERVE_RATE")]
    pub observe_rate: u32,
    /// Bytes of request bodies the observer reads per second at most (as
    /// well as --observe-rate writes), so that its CPU does not grow with
    /// the size of the statuses: at the default, all of 200 writes of 40 KB
    /// a second, or about 20 of 800 KB.
    #[arg(long, default_value_t = crate::cluster::observer::DEFAULT_OBSERVE_BYTES_RATE, env = "STATUSGUARD_OBSERVE_BYTES_RATE")]
    pub observe_bytes_rate: u64,
    /// Identities the record names; writes of more are counted as "(other)".
    #[arg(long, default_value_t = 256, env = "STATUSGUARD_OBSERVE_MAX_IDENTITIES")]
    pub observe_max_identities: usize,
    /// A Warning Event on the object for each denied or trimmed write (when
    /// the server talks to a cluster: --configmap, --register-webhooks or
    /// --manage-certificates).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "STATUSGUARD_EVENTS")]
    pub events: bool,
    /// At most one Event per object, reason and writer in this interval;
    /// repeats become the Event's series count.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, env = "STATUSGUARD_EVENT_INTERVAL")]
    pub event_interval: Duration,
    /// Events sent per second at most, in all (whatever the objects and
    /// writers); 0: none.
    #[arg(long, default_value_t = 5, env = "STATUSGUARD_EVENT_RATE")]
    pub event_rate: u32,
    /// How many Events may go out at once after a quiet spell (the burst of
    /// --event-rate).
    #[arg(long, default_value_t = 20, env = "STATUSGUARD_EVENT_BURST")]
    pub event_burst: u32,
    /// Bytes the writes waiting for the observer may take (copies of their
    /// statuses, never the request bodies); a write that does not fit is
    /// not observed (statusguard_observations_skipped_total{result="bytes"}).
    #[arg(long, default_value_t = 8 * 1024 * 1024, env = "STATUSGUARD_OBSERVE_QUEUE_BYTES")]
    pub observe_queue_bytes: usize,
}

/// Certificates the server keeps itself, in a Secret its replicas share.
#[derive(Debug, Args)]
pub struct ManagedCertArgs {
    /// NAMESPACE/NAME of a Secret in which the server keeps a CA and its
    /// serving certificate, renewed and rotated (instead of --tls-cert).
    #[arg(long, env = "STATUSGUARD_MANAGE_CERTIFICATES", conflicts_with_all = ["tls_cert", "write_ca"])]
    pub manage_certificates: Option<SecretRef>,
    /// More names (DNS or IP) for the serving certificate, besides those of --webhook-target.
    #[arg(long = "cert-name", env = "STATUSGUARD_CERT_NAMES", value_delimiter = ',')]
    pub cert_names: Vec<String>,
    /// How long a serving certificate is valid (renewed in its last third).
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration, env = "STATUSGUARD_CERT_VALIDITY")]
    pub cert_validity: Duration,
    /// How long the CA is valid (rotated in its last third).
    #[arg(long, default_value = "3650d", value_parser = humantime::parse_duration, env = "STATUSGUARD_CA_VALIDITY")]
    pub ca_validity: Duration,
    /// How long a new CA is trusted before it signs what is served, and the
    /// old one after: longer than the check interval and the time the API
    /// server takes to see a new caBundle.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, env = "STATUSGUARD_CERT_OVERLAP")]
    pub cert_overlap: Duration,
    /// How often the Secret is read again.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration, env = "STATUSGUARD_CERT_CHECK_INTERVAL")]
    pub cert_check_interval: Duration,
}

/// Server-managed webhook configurations.
#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Keep a ValidatingWebhookConfiguration and a MutatingWebhookConfiguration
    /// of this name in step with the rules in force (server-side apply).
    #[arg(long, env = "STATUSGUARD_REGISTER_WEBHOOKS", requires = "webhook_target")]
    pub register_webhooks: Option<String>,
    /// Where the API server sends reviews: NAMESPACE/NAME:PORT of a Service, or an https:// base URL.
    #[arg(long, env = "STATUSGUARD_WEBHOOK_TARGET")]
    pub webhook_target: Option<WebhookTarget>,
    /// PEM CA bundle written into the configurations' caBundle (re-read every 2 s).
    #[arg(long, env = "STATUSGUARD_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: Option<PathBuf>,
    /// failurePolicy of the enforce and trim webhooks (audit resources always have Ignore).
    #[arg(long, value_enum, default_value = "fail", env = "STATUSGUARD_WEBHOOK_FAILURE_POLICY")]
    pub webhook_failure_policy: FailurePolicy,
    /// How long the API server waits for an answer (1 to 30 s).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..=30), env = "STATUSGUARD_WEBHOOK_TIMEOUT_SECONDS")]
    pub webhook_timeout_seconds: i32,
    /// namespaceSelector of the webhooks, as JSON (a LabelSelector).
    #[arg(long, value_parser = parse_label_selector, env = "STATUSGUARD_WEBHOOK_NAMESPACE_SELECTOR")]
    pub webhook_namespace_selector: Option<LabelSelector>,
    /// objectSelector of the webhooks, as JSON (a LabelSelector).
    #[arg(long, value_parser = parse_label_selector, env = "STATUSGUARD_WEBHOOK_OBJECT_SELECTOR")]
    pub webhook_object_selector: Option<LabelSelector>,
    /// How often the configurations (and the policies) are applied again when nothing changed.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, env = "STATUSGUARD_WEBHOOK_RESYNC")]
    pub webhook_resync: Duration,
    /// Keep the rules as ValidatingAdmissionPolicies and
    /// MutatingAdmissionPolicies (with bindings) named NAME.<resource>.<group>
    /// in step with the rules in force (server-side apply): the API server
    /// enforces them itself, with no webhook (`statusguard export policies`).
    #[arg(long, env = "STATUSGUARD_REGISTER_POLICIES", value_parser = crate::policies::set_name)]
    pub register_policies: Option<String>,
    /// Apply the policies even for a document they decide differently from
    /// the webhook (`statusguard check` lists where).
    #[arg(long, env = "STATUSGUARD_REGISTER_POLICIES_ALLOW_DEVIATIONS")]
    pub register_policies_allow_deviations: bool,
}

fn parse_label_selector(text: &str) -> Result<LabelSelector, String> {
    serde_json::from_str(text).map_err(|e| format!("not a LabelSelector in JSON: {e}"))
}

/// `statusguard unregister`.
#[derive(Debug, Args)]
pub struct UnregisterArgs {
    /// The name of the webhook configurations (the server's
    /// --register-webhooks), which is also the name of the set of admission
    /// policies deleted (the server's --register-policies).
    #[arg(long, env = "STATUSGUARD_REGISTER_WEBHOOKS")]
    pub name: String,
    /// NAMESPACE/NAME of the ownership ConfigMap, annotated so that running
    /// servers stop applying the configurations.
    #[arg(long, env = "STATUSGUARD_CONFIGMAP")]
    pub configmap: Option<ConfigMapRef>,
    /// The configurations must stay gone this long before it returns.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
}

/// The serving certificate.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// PEM certificate chain, leaf first; re-read when it changes.
    #[arg(long, env = "STATUSGUARD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    #[arg(long, env = "STATUSGUARD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How often the certificate files (and --client-ca-file) are checked for a change.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, env = "STATUSGUARD_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Duration,
    /// Without --tls-cert: write the CA that verifies the generated certificate here.
    #[arg(long, env = "STATUSGUARD_WRITE_CA", conflicts_with = "tls_cert")]
    pub write_ca: Option<PathBuf>,
    /// Without --tls-cert: more names (DNS or IP) for the generated certificate.
    #[arg(long = "tls-san", env = "STATUSGUARD_TLS_SAN", value_delimiter = ',')]
    pub tls_sans: Vec<String>,
    /// PEM bundle of CAs: every caller of the TLS port must present a client
    /// certificate that chains to one of them, as the API server does when
    /// its AdmissionConfiguration names a kubeconfig with one for this
    /// webhook. Re-read when it changes. Default: no client certificate asked for.
    #[arg(long, env = "STATUSGUARD_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
}

/// `statusguard probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The name of the webhook configurations (the server's
    /// --register-webhooks), which is also the name of the set of admission
    /// policies deleted (the server's --register-policies).
    #[arg(long, env = "STATUSGUARD_REGISTER_WEBHOOKS")]
    pub name: String,
    /// NAMESPACE/NAME of the ownership ConfigMap: with it, a configuration
    /// without webhooks fails when the document guards resources.
    #[arg(long, env = "STATUSGUARD_CONFIGMAP")]
    pub configmap: Option<ConfigMapRef>,
    /// Dial HOST:PORT instead of the configuration's Service or URL host,
    /// e.g. a `kubectl port-forward`; TLS still verifies the configured name.
    #[arg(long)]
    pub connect_to: Option<String>,
    /// Limit on each call.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// PEM client certificate to present, for a server with --client-ca-file.
    #[arg(long, env = "STATUSGUARD_PROBE_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "STATUSGUARD_PROBE_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

/// `statusguard suggest`.
#[derive(Debug, Args)]
pub struct SuggestArgs {
    /// RESOURCE.GROUP, e.g. widgets.example.com (a core resource alone).
    #[arg(required = true)]
    pub resources: Vec<String>,
    /// Only this namespace's objects (default: all).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// A replica's observed writes: http://HOST:PORT/observed (its admin
    /// port) or a saved copy; repeat for each replica. Maps field managers
    /// to the identities the webhook enforces.
    #[arg(long)]
    pub observed: Vec<String>,
    /// Where the conditions list lives below .status.
    #[arg(long, default_value = "conditions")]
    pub conditions: String,
}

/// `statusguard check`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct CheckArgs {
    /// The ownership document, or a ConfigMap manifest with key `ownership.yaml`.
    #[arg(env = "STATUSGUARD_CHECK_FILE")]
    pub file: Option<PathBuf>,
    /// Check the live ConfigMap NAMESPACE/NAME instead, as the server would
    /// read it (in-cluster config, or KUBECONFIG).
    #[arg(long, env = "STATUSGUARD_CONFIGMAP")]
    pub configmap: Option<ConfigMapRef>,
}

/// `statusguard review`.
#[derive(Debug, Args)]
pub struct ReviewArgs {
    /// The ownership document (or a ConfigMap manifest holding it).
    #[arg(long, env = "STATUSGUARD_OWNERSHIP")]
    pub ownership: PathBuf,
    /// Which endpoint to answer as.
    #[arg(long, value_enum, default_value = "validate", env = "STATUSGUARD_ENDPOINT")]
    pub endpoint: Endpoint,
    /// An AdmissionReview (admission.k8s.io/v1) as JSON; `-` reads standard input.
    pub review: PathBuf,
}

/// `statusguard gen-certs`.
#[derive(Debug, Args)]
pub struct GenCertsArgs {
    /// Folder to write ca.crt, tls.crt and tls.key into.
    #[arg(long, env = "STATUSGUARD_OUT_DIR")]
    pub out_dir: PathBuf,
    /// More names (DNS or IP) besides localhost, 127.0.0.1 and ::1.
    #[arg(long = "tls-san", env = "STATUSGUARD_TLS_SAN", value_delimiter = ',')]
    pub tls_sans: Vec<String>,
}

/// `--endpoint` takes the decision's own [`Endpoint`], by the name its
/// metrics and logs use.
impl ValueEnum for Endpoint {
    fn value_variants<'a>() -> &'a [Self] {
        &[Endpoint::Validate, Endpoint::Mutate]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let path = match self {
            Endpoint::Validate => "`/validate`",
            Endpoint::Mutate => "`/mutate`",
        };
        Some(PossibleValue::new(self.as_str()).help(path))
    }
}
