//! A real kube-apiserver and etcd on loopback, like controller-runtime's envtest.
//!
//! One control plane per test binary ([`Cluster::shared`], or
//! [`Cluster::shared_with`] for a kube-apiserver with more flags), started on first
//! use from the binaries that `tests/cluster/build.sh` builds (or
//! `STATUSGUARD_TEST_ASSETS`). Every process runs under a small shell guard
//! that holds a pipe from this test process: when the test binary exits for
//! any reason (success, panic, abort, SIGKILL), the pipe closes and the guard
//! stops the process and removes its data, so no orphan survives `cargo test`.
#![allow(dead_code)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use serde_json::json;

use super::wait::free_port;

/// A running control plane. Lives as long as the test binary.
pub struct Cluster {
    pub dir: PathBuf,
    pub url: String,
    pub ca_pem: String,
    /// kubeconfig of the admin user (group system:masters).
    pub kubeconfig: PathBuf,
    pub assets: PathBuf,
    apiserver: Mutex<Option<Guarded>>,
    etcd: Mutex<Guarded>,
    apiserver_args: Vec<String>,
}

/// A process under the shell guard; dropping the pipe stops it.
struct Guarded {
    child: Child,
    _pipe: ChildStdin,
    log: PathBuf,
}

/// Runs `program args…` under a guard that stops it when our pipe closes
/// (this process ended) and then removes `cleanup`.
fn guarded(program: &Path, args: &[String], log: &Path, cleanup: &Path) -> Result<Guarded, String> {
    let script = r#"
log=$1; cleanup=$2; shift 2
exec 3<&0
"$@" >"$log" 2>&1 </dev/null 3<&- &
pid=$!
# EOF on the pipe: the test process is gone, or asked us to stop. Nothing of
# a test cluster is worth keeping: stop at once.
{ while read -r _ <&3; do :; done; kill -KILL "$pid" 2>/dev/null; } &
watcher=$!
exec 3<&-
# The guard ends with the process, so that an early exit is seen at once.
wait "$pid"
status=$?
kill "$watcher" 2>/dev/null
[ -n "$cleanup" ] && rm -rf "$cleanup"
exit "$status"
"#;
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg("guard")
        .arg(log)
        .arg(cleanup)
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let pipe = child.stdin.take().ok_or("no pipe to the guard")?;
    Ok(Guarded {
        child,
        _pipe: pipe,
        log: log.to_owned(),
    })
}

impl Guarded {
    /// Stops the process and waits for the guard to finish.
    fn stop(self) {
        let Guarded { mut child, _pipe, .. } = self;
        drop(_pipe);
        let _ = child.wait();
    }

    fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The folder with kube-apiserver, etcd and helm: built (or found in the
/// cache) by tests/cluster/build.sh, or STATUSGUARD_TEST_ASSETS.
pub fn assets() -> Result<PathBuf, String> {
    static ASSETS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ASSETS
        .get_or_init(|| super::printed_path("tests/cluster/build.sh"))
        .clone()
}

struct Pki {
    ca_pem: String,
    serving_cert: String,
    serving_key: String,
    client_ca_pem: String,
    admin_cert: String,
    admin_key: String,
    sa_public: String,
    sa_private: String,
}

fn make_pki() -> Result<Pki, rcgen::Error> {
    let serving = statusguard::cluster::certs::policy::generate_certificates(&[])
        .map_err(|e| rcgen::Error::PemError(e.to_string()))?;

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, "test client CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut admin = CertificateParams::new(Vec::<String>::new())?;
    admin.distinguished_name.push(DnType::CommonName, "test-admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_key = KeyPair::generate()?;
    let admin_cert = admin.signed_by(&admin_key, &ca)?;

    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: serving.ca_pem,
        serving_cert: serving.cert_pem,
        serving_key: serving.key_pem,
        client_ca_pem: ca.pem(),
        admin_cert: admin_cert.pem(),
        admin_key: admin_key.serialize_pem(),
        sa_public: sa.public_key_pem(),
        sa_private: sa.serialize_pem(),
    })
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A kubeconfig for `url` with the given `user` section (YAML flow mapping).
pub fn kubeconfig(url: &str, ca_pem: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\ncurrent-context: test\nusers:\n- name: test\n  user: {user}\n",
        b64(ca_pem)
    )
}

/// What a test binary adds to its kube-apiserver: called with the control
/// plane's folder (removed with it) before kube-apiserver starts, it writes
/// the files it needs there and returns the extra arguments.
pub type ApiServerSetup = fn(&Path) -> Result<Vec<String>, String>;

impl Cluster {
    /// The control plane of this test binary, started on first use.
    /// Panics with a clear message when it cannot start: a test that needs
    /// it never skips silently.
    pub fn shared() -> &'static Cluster {
        Self::shared_with(|_| Ok(Vec::new()))
    }

    /// [`shared`](Self::shared), its kube-apiserver started with what `setup`
    /// adds. The first call of the binary starts it: every test of a binary
    /// passes the same `setup` (or calls `shared`, for none).
    pub fn shared_with(setup: ApiServerSetup) -> &'static Cluster {
        static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
        // Started on a thread of its own: the readiness poll runs its own
        // runtime, which cannot nest inside the calling test's runtime.
        let start = || {
            std::thread::spawn(move || Cluster::start(setup))
                .join()
                .unwrap_or_else(|_| Err("the start-up thread panicked".into()))
        };
        match CLUSTER.get_or_init(start) {
            Ok(cluster) => cluster,
            Err(e) => panic!("cannot start the test control plane (kube-apiserver + etcd): {e}"),
        }
    }

    /// Starts a control plane, trying new ports when one chosen was taken
    /// before the process could bind it.
    fn start(setup: ApiServerSetup) -> Result<Cluster, String> {
        let mut attempt = 1;
        loop {
            match Self::start_once(setup) {
                Err(e) if e.contains("address already in use") && attempt < 3 => attempt += 1,
                result => return result,
            }
        }
    }

    fn start_once(setup: ApiServerSetup) -> Result<Cluster, String> {
        let assets = assets()?;
        let dir = tempfile::Builder::new()
            .prefix("statusguard-cluster-")
            .tempdir()
            .map_err(|e| format!("no temp dir: {e}"))?
            .keep();
        let pki = make_pki().map_err(|e| format!("cannot make certificates: {e}"))?;
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok(path)
        };
        let p = |path: PathBuf| path.display().to_string();
        let serving_cert = p(write("serving.crt", &pki.serving_cert)?);
        let serving_key = p(write("serving.key", &pki.serving_key)?);
        let client_ca = p(write("client-ca.crt", &pki.client_ca_pem)?);
        let sa_pub = p(write("sa.pub", &pki.sa_public)?);
        let sa_key = p(write("sa.key", &pki.sa_private)?);

        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args: Vec<String> = vec![
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        // The etcd guard owns the cleanup of the whole folder: it stops last.
        let etcd = guarded(&assets.join("etcd"), &etcd_args, &dir.join("etcd.log"), &dir)?;

        let url = format!("https://127.0.0.1:{api_port}");
        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--tls-cert-file={serving_cert}"),
            format!("--tls-private-key-file={serving_key}"),
            format!("--client-ca-file={client_ca}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={sa_pub}"),
            format!("--service-account-signing-key-file={sa_key}"),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // A webhook's Service is reached at its EndpointSlices' addresses,
            // not its ClusterIP (nothing proxies ClusterIPs here): the path
            // a real cluster takes, through the Service's endpoints.
            "--enable-aggregator-routing=true".into(),
        ];
        apiserver_args.extend(setup(&dir)?);
        let apiserver = guarded(
            &assets.join("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
            Path::new(""),
        )?;

        let user = format!(
            "{{client-certificate-data: {}, client-key-data: {}}}",
            b64(&pki.admin_cert),
            b64(&pki.admin_key)
        );
        let kubeconfig = write("admin.kubeconfig", &kubeconfig(&url, &pki.ca_pem, &user))?;
        let cluster = Cluster {
            dir,
            url,
            ca_pem: pki.ca_pem,
            kubeconfig,
            assets,
            apiserver: Mutex::new(Some(apiserver)),
            etcd: Mutex::new(etcd),
            apiserver_args,
        };
        cluster.wait_ready(Duration::from_secs(180))?;
        Ok(cluster)
    }

    /// Polls /readyz with the admin certificate (5–30 s on 2 cores).
    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        let kubeconfig = self.kubeconfig.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        loop {
            if let Ok(mut apiserver) = self.apiserver.lock()
                && let Some(apiserver) = apiserver.as_mut()
                && let Ok(Some(status)) = apiserver.child.try_wait()
            {
                return Err(format!(
                    "kube-apiserver exited ({status}); its log:\n{}",
                    log_tail(&self.dir.join("kube-apiserver.log"))
                ));
            }
            if let Ok(mut etcd) = self.etcd.lock()
                && let Ok(Some(status)) = etcd.child.try_wait()
            {
                return Err(format!("etcd exited ({status}); its log:\n{}", etcd.log_tail()));
            }
            let ready = runtime.block_on(async {
                let client = client_from_kubeconfig(&kubeconfig).await.ok()?;
                let req = http::Request::get("/readyz").body(Vec::new()).ok()?;
                client.request_text(req).await.ok()
            });
            if ready.as_deref() == Some("ok") {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "kube-apiserver was not ready after {limit:?}; its log:\n{}\netcd's log:\n{}",
                    log_tail(&self.dir.join("kube-apiserver.log")),
                    log_tail(&self.dir.join("etcd.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Stops kube-apiserver and starts it again on the same port and etcd.
    pub fn restart_apiserver(&self) -> Result<(), String> {
        {
            let mut guard = self.apiserver.lock().map_err(|_| "poisoned")?;
            // The old one must be gone before the new one binds the same port.
            if let Some(old) = guard.take() {
                old.stop();
            }
            let log = self.dir.join("kube-apiserver.log");
            *guard = Some(guarded(
                &self.assets.join("kube-apiserver"),
                &self.apiserver_args,
                &log,
                Path::new(""),
            )?);
        }
        self.wait_ready(Duration::from_secs(180))
    }

    pub async fn admin(&self) -> Client {
        client_from_kubeconfig(&self.kubeconfig)
            .await
            .expect("the admin kubeconfig works")
    }

    /// A client that authenticates as `namespace/name` with a real bearer
    /// token from the TokenRequest API.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        let path = self.service_account_kubeconfig(namespace, name).await;
        client_from_kubeconfig(&path).await.unwrap()
    }

    /// A kubeconfig file with a TokenRequest token of `namespace/name`.
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.token(namespace, name).await;
        // Tests run in parallel and ask for the same identities: each gets a
        // file of its own, never one another test is still writing.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = self.dir.join(format!("{namespace}-{name}-{n}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig(&self.url, &self.ca_pem, &format!("{{token: {token}}}")),
        )
        .unwrap();
        path
    }

    pub async fn token(&self, namespace: &str, name: &str) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.admin().await, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = api
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap();
        created.status.and_then(|s| s.token).expect("a token")
    }
}

pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, kube::Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    Client::try_from(config)
}

/// Creates `object`, or leaves the existing one alone.
pub async fn ensure<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("cannot create {object:?}: {e}"),
    }
}

pub async fn ensure_json<K>(api: &Api<K>, object: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    ensure(api, &serde_json::from_value::<K>(object).unwrap()).await;
}

pub async fn namespace(client: &Client, name: &str, labels: serde_json::Value) {
    let api: Api<Namespace> = Api::all(client.clone());
    ensure_json(&api, json!({"metadata": {"name": name, "labels": labels}})).await;
}

pub async fn service_account(client: &Client, namespace: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    ensure_json(&api, json!({"metadata": {"name": name}})).await;
}

pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets")
}

pub fn widgets(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &widget_resource())
}

/// Installs `tests/cluster/widget-crd.yaml` and waits until it is Established.
pub async fn install_widget_crd(client: &Client) {
    use kube::runtime::wait::{await_condition, conditions};
    let text = include_str!("../cluster/widget-crd.yaml");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(text).unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    ensure(&api, &crd).await;
    let name = crd.metadata.name.clone().unwrap();
    let established = await_condition(api, &name, conditions::is_crd_established());
    tokio::time::timeout(Duration::from_secs(60), established)
        .await
        .expect("the Widget CRD was Established in time")
        .expect("the CRD can be watched");
    // Discovery and the storage for the new resource settle just after.
    let probe = widgets(client, "default");
    let params = kube::api::ListParams::default();
    super::wait::retry_until(Duration::from_secs(30), "the Widget resource is served", || {
        probe.list(&params)
    })
    .await;
}

/// Grants `subjects` (namespace, name) get/list/watch/update/patch on widgets and widgets/status.
pub async fn grant_widget_writers(client: &Client, subjects: &[(&str, &str)]) {
    grant_status_writers(client, "widget-writer", "example.com", "widgets", subjects).await;
}

/// Grants `subjects` (namespace, name) get/list/watch/update/patch on
/// `resource` of `group` and its status, through the ClusterRole `role`.
pub async fn grant_status_writers(client: &Client, role: &str, group: &str, resource: &str, subjects: &[(&str, &str)]) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let roles: Api<ClusterRole> = Api::all(client.clone());
    ensure_json(
        &roles,
        json!({"metadata": {"name": role}, "rules": [{
            "apiGroups": [group], "resources": [resource, format!("{resource}/status")],
            "verbs": ["get", "list", "watch", "update", "patch"]}]}),
    )
    .await;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for (ns, name) in subjects {
        ensure_json(
            &bindings,
            json!({"metadata": {"name": format!("{role}-{ns}-{name}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "namespace": ns, "name": name}]}),
        )
        .await;
    }
}

/// Registers a test's webhook configurations, both named
/// `statusguard-<namespace>`, for `UPDATE` of `resources` (e.g.
/// `widgets/status`) of `group`, in the namespace labelled
/// `statusguard-test: <namespace>`, at `https://127.0.0.1:port/validate`
/// (and `/mutate`, reinvoked if needed, when `mutate`): how the tests
/// register a server of their own without a Service.
pub async fn register_test_webhooks(
    admin: &Client,
    namespace: &str,
    (group, resources): (&str, &[&str]),
    port: u16,
    ca_pem: &str,
    mutate: bool,
) {
    use base64::Engine as _;
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
    let webhook = |path: &str| {
        serde_json::json!({
            "name": format!("{}.statusguard.dev", path),
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/{path}"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{"apiGroups": [group], "apiVersions": ["*"], "resources": resources,
                       "operations": ["UPDATE"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"statusguard-test": namespace}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5,
        })
    };
    let name = format!("statusguard-{namespace}");
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    ensure_json(
        &validating,
        serde_json::json!({"metadata": {"name": name}, "webhooks": [webhook("validate")]}),
    )
    .await;
    if mutate {
        let mut hook = webhook("mutate");
        hook["reinvocationPolicy"] = serde_json::json!("IfNeeded");
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
        ensure_json(
            &mutating,
            serde_json::json!({"metadata": {"name": name}, "webhooks": [hook]}),
        )
        .await;
    }
}
