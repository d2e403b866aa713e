//! The shared-status scenario on the real control plane: a Widget written
//! by two ServiceAccounts, `platform/widget-controller` and
//! `platform/widget-scaler`, and statusguard registered by URL.
#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use serde_json::{Value, json};

use super::cluster::{self, Cluster};
use super::webhook::{RunningServer, config, files, write_pair};

pub const CONTROLLER: (&str, &str) = ("platform", "widget-controller");
pub const SCALER: (&str, &str) = ("platform", "widget-scaler");

/// One test's share of the cluster: its own namespace, labelled so that only
/// its own webhook configurations apply to it.
pub struct Scenario {
    pub cluster: &'static Cluster,
    pub admin: Client,
    pub controller: Client,
    pub scaler: Client,
    pub namespace: String,
}

impl Scenario {
    pub async fn new(test: &str) -> Self {
        Self::on(Cluster::shared(), test).await
    }

    /// [`new`](Self::new) on `cluster`, e.g. one of [`Cluster::shared_with`].
    pub async fn on(cluster: &'static Cluster, test: &str) -> Self {
        let admin = cluster.admin().await;
        cluster::install_widget_crd(&admin).await;
        cluster::namespace(&admin, "platform", json!({})).await;
        for (ns, name) in [CONTROLLER, SCALER] {
            cluster::service_account(&admin, ns, name).await;
        }
        cluster::grant_widget_writers(&admin, &[CONTROLLER, SCALER]).await;
        cluster::namespace(&admin, test, json!({"statusguard-test": test})).await;
        let controller = cluster.service_account_client(CONTROLLER.0, CONTROLLER.1).await;
        let scaler = cluster.service_account_client(SCALER.0, SCALER.1).await;
        Self {
            cluster,
            admin,
            controller,
            scaler,
            namespace: test.to_owned(),
        }
    }

    fn base_path(&self) -> String {
        format!("/apis/example.com/v1/namespaces/{}/widgets", self.namespace)
    }

    /// Creates a Widget with a status written by the admin (exempt).
    pub async fn create_widget(&self, name: &str, status: Value) -> Value {
        let api = cluster::widgets(&self.admin, &self.namespace);
        let object = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": 3}
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &object).await.unwrap();
        let mut with_status = serde_json::to_value(&created).unwrap();
        with_status["status"] = status;
        let written = put_status(&self.admin, &self.base_path(), &with_status).await;
        assert_eq!(written.code, 200, "{:?}", written.body);
        written.body
    }

    pub async fn get(&self, client: &Client, name: &str) -> Value {
        let api = cluster::widgets(client, &self.namespace);
        serde_json::to_value(api.get(name).await.unwrap()).unwrap()
    }

    /// A full Update of the status subresource (what `replace_status` sends).
    pub async fn put_status(&self, client: &Client, object: &Value) -> Written {
        put_status(client, &self.base_path(), object).await
    }

    pub async fn merge_patch_status(&self, client: &Client, name: &str, patch: Value) -> Written {
        let request = Request::new(self.base_path())
            .patch_subresource("status", name, &PatchParams::default(), &Patch::Merge(patch))
            .unwrap();
        send(client, request).await
    }

    /// A merge patch of `name`'s `observedGeneration` by `who`, to a value
    /// never written before in this test binary: always a change, so that a
    /// write let through once does not make the next one a no-op (allowed
    /// as such). The status code.
    pub async fn write_observed_generation(&self, who: &Client, name: &str) -> u16 {
        static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(100);
        let value = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.merge_patch_status(who, name, json!({"status": {"observedGeneration": value}}))
            .await
            .code
    }

    pub async fn apply_status(&self, client: &Client, manager: &str, name: &str, status: Value) -> Written {
        let body =
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "status": status});
        let request = Request::new(self.base_path())
            .patch_subresource(
                "status",
                name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(body),
            )
            .unwrap();
        send(client, request).await
    }

    /// Merge-patches `status.observedGeneration` of `name` as `who` with
    /// values counting up from `from` until one is accepted (bounded by
    /// `limit`); returns the value stored. For edits of the rules that take
    /// effect within seconds.
    pub async fn wait_until_writable(&self, who: &Client, name: &str, from: i64, limit: Duration, what: &str) -> i64 {
        let mut value = from;
        super::wait::retry_until(limit, what, || {
            value += 1;
            let value = value;
            async move {
                let written = self
                    .merge_patch_status(who, name, json!({"status": {"observedGeneration": value}}))
                    .await;
                if written.code == 200 {
                    Ok(value)
                } else {
                    Err(written.body)
                }
            }
        })
        .await
    }

    /// The bug: the scaler read the widget, then the controller wrote
    /// `observedGeneration: 2`; the scaler's full update conflicts, it
    /// refreshes only the resourceVersion and retries its stale copy with
    /// `replicas: 5`. Returns the retry's answer.
    pub async fn stale_retry(&self, name: &str) -> Written {
        let mut stale = self.get(&self.scaler, name).await;

        let mut fresh = self.get(&self.controller, name).await;
        fresh["status"]["observedGeneration"] = json!(2);
        let written = self.put_status(&self.controller, &fresh).await;
        assert_eq!(written.code, 200, "the controller's write: {:?}", written.body);

        stale["status"]["replicas"] = json!(5);
        let first = self.put_status(&self.scaler, &stale).await;
        assert_eq!(first.code, 409, "the stale write conflicts: {:?}", first.body);

        let latest = self.get(&self.scaler, name).await;
        stale["metadata"]["resourceVersion"] = latest["metadata"]["resourceVersion"].clone();
        self.put_status(&self.scaler, &stale).await
    }

    /// statusguard on `rules` (in process, TLS from a fresh pair in the
    /// returned folder), registered for this test's namespace.
    pub async fn guarded_by(
        &self,
        rules: statusguard::rules::RulesSource,
        mutate: bool,
    ) -> (RunningServer, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let certs = write_pair(dir.path());
        let server = RunningServer::start(config(rules, Some(files(dir.path())))).await;
        self.register(&server, &certs.ca_pem, mutate).await;
        (server, dir)
    }

    /// Registers statusguard for this test's namespace; `mutate` adds the
    /// mutating webhook (trim mode). Waits until the API server really calls it.
    pub async fn register(&self, server: &RunningServer, ca_pem: &str, mutate: bool) {
        let app = server.app.clone();
        self.register_at(server.tls.port(), ca_pem, mutate, || {
            let app = app.clone();
            async move { app.metrics.encode() }
        })
        .await;
    }

    /// Registers the webhook at `https://127.0.0.1:port/`; `metrics` reads the
    /// server's /metrics, to see that the API server really calls it.
    pub async fn register_at<F, Fut>(&self, port: u16, ca_pem: &str, mutate: bool, metrics: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = String>,
    {
        cluster::register_test_webhooks(
            &self.admin,
            &self.namespace,
            ("example.com", &["widgets/status"]),
            port,
            ca_pem,
            mutate,
        )
        .await;
        let wanted: &[&str] = if mutate {
            &["endpoint=\"validate\"", "endpoint=\"mutate\""]
        } else {
            &["endpoint=\"validate\""]
        };
        self.wait_until_called(wanted, metrics).await;
    }

    /// Waits until the server's /metrics (read by `metrics`) counts reviews
    /// with each of the `wanted` labels: a dry-run status write by the
    /// scaler (its own object unchanged: allowed; not an exempt identity,
    /// which matchConditions keep away) reaches the webhook once the API
    /// server has loaded its configuration.
    pub async fn wait_until_called<F, Fut>(&self, wanted: &[&str], metrics: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = String>,
    {
        if cluster::widgets(&self.admin, &self.namespace)
            .get_opt("webhook-probe")
            .await
            .unwrap()
            .is_none()
        {
            self.create_widget("webhook-probe", json!({})).await;
        }
        super::wait::retry_until(Duration::from_secs(30), "the API server calls the webhook", || async {
            let object = self.get(&self.admin, "webhook-probe").await;
            let request = Request::new(self.base_path())
                .replace_subresource(
                    "status",
                    "webhook-probe",
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    serde_json::to_vec(&object).unwrap(),
                )
                .unwrap();
            let probe = send(&self.scaler, request).await;
            let metrics = metrics().await;
            let called = wanted.iter().all(|w| {
                metrics
                    .lines()
                    .any(|l| l.starts_with("statusguard_admission_requests_total") && l.contains(w))
            });
            if called {
                Ok(())
            } else {
                Err(format!(
                    "the probe got {} {}; /metrics: {metrics}",
                    probe.code, probe.body
                ))
            }
        })
        .await
    }

    pub async fn unregister(&self) {
        let name = format!("statusguard-{}", self.namespace);
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(self.admin.clone());
        let _ = validating.delete(&name, &DeleteParams::default()).await;
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(self.admin.clone());
        let _ = mutating.delete(&name, &DeleteParams::default()).await;
    }
}

/// An API answer: status code, the `Warning` headers, and the body.
#[derive(Debug)]
pub struct Written {
    pub code: u16,
    pub warnings: Vec<String>,
    pub body: Value,
}

impl Written {
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }
}

pub async fn put_status(client: &Client, base: &str, object: &Value) -> Written {
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    let request = Request::new(base)
        .replace_subresource(
            "status",
            &name,
            &PostParams::default(),
            serde_json::to_vec(object).unwrap(),
        )
        .unwrap();
    send(client, request).await
}

pub async fn send(client: &Client, request: http::Request<Vec<u8>>) -> Written {
    let response = client.send(request.map(kube::client::Body::from)).await.unwrap();
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Written { code, warnings, body }
}

pub fn name_of(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}
