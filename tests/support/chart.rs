//! The Helm chart as the tests use it: helm with a home of its own, rendered
//! manifests, and the arguments the chart gives its containers, mapped onto
//! this machine so that a test runs the binary exactly as a pod would.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::cluster;
use super::webhook::BinaryServer;

pub fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/statusguard")
}

/// helm, with its caches and config in a folder of the test's own.
pub fn helm(home: &Path) -> Command {
    let assets = cluster::assets().unwrap_or_else(|e| panic!("no helm binary: {e}"));
    let mut command = Command::new(assets.join("helm"));
    for var in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
        command.env(var, home.join(var));
    }
    command
}

/// `helm template RELEASE` in `namespace` with `values` (YAML); Ok(manifests) or Err(stderr).
pub fn template_as(release: &str, namespace: &str, values: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let output = helm(dir.path())
        .args(["template", release])
        .arg(chart())
        // The chart's kubeVersion is checked against this (helm template
        // alone assumes an old default).
        .args(["-n", namespace, "--kube-version", "1.36.0", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

pub fn documents(manifests: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(manifests)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The first container's arguments of the first object of `kind`
/// (Deployment, Job, Pod) in the manifests.
pub fn container_args(manifests: &str, kind: &str) -> Vec<String> {
    let docs = documents(manifests);
    let object = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"));
    let pod = match kind {
        "Pod" => &object["spec"],
        _ => &object["spec"]["template"]["spec"],
    };
    pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// A container's arguments as this machine runs them: the files the chart
/// mounts under /etc/statusguard/{tls,ca}/ read from `dir`, and without
/// `serve` and the listen addresses (the test's server picks free ports).
pub fn on_this_machine(args: &[String], dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    args.iter()
        .filter(|a| *a != "serve" && !a.starts_with("--listen=") && !a.starts_with("--admin-listen="))
        .map(|a| {
            a.replace("/etc/statusguard/tls/", &format!("{dir}/"))
                .replace("/etc/statusguard/ca/", &format!("{dir}/"))
        })
        .collect()
}

/// Values that install `ownership` with the webhook at the server a test
/// runs on this machine's TLS port `port`, then the lines `more`.
pub fn local_values(ownership: &str, port: u16, more: &str) -> String {
    let indented: String = ownership.lines().map(|l| format!("  {l}\n")).collect();
    format!("ownership:\n{indented}webhook:\n  url: https://127.0.0.1:{port}\n{more}")
}

/// A release of the chart installed in the test cluster, driven with helm
/// as a user would.
pub struct Release {
    pub name: String,
    pub namespace: String,
    home: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl Release {
    /// helm's home is `home`; `kubeconfig` is the cluster admin's.
    pub fn new(home: &Path, name: &str, namespace: &str, kubeconfig: &Path) -> Self {
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            home: home.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
        }
    }

    /// Runs `helm ARGS --kubeconfig ...`, asserts it succeeded, returns its output.
    pub fn helm(&self, args: &[&str]) -> String {
        self.try_helm(args)
            .unwrap_or_else(|stderr| panic!("helm {args:?}: {stderr}"))
    }

    /// Runs `helm ARGS --kubeconfig ...`: its output, or its error output.
    pub fn try_helm(&self, args: &[&str]) -> Result<String, String> {
        let output = helm(&self.home)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .output()
            .unwrap();
        match output.status.success() {
            true => Ok(String::from_utf8(output.stdout).unwrap()),
            false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
        }
    }

    /// Writes `values` to the file `install` and `upgrade` read.
    pub fn values(&self, values: &str) -> String {
        let file = self.home.join("values.yaml");
        std::fs::write(&file, values).unwrap();
        file.display().to_string()
    }

    /// `helm install` (creating the namespace) with `values`.
    pub fn install(&self, values: &str) {
        let file = self.values(values);
        let chart = chart().display().to_string();
        self.helm(&[
            "install",
            &self.name,
            &chart,
            "-n",
            &self.namespace,
            "--create-namespace",
            "-f",
            &file,
        ]);
    }

    /// `helm upgrade` with `values`.
    pub fn upgrade(&self, values: &str) {
        self.upgrade_with(values, &[]);
    }

    /// `helm upgrade` with `values` and `extra` arguments (e.g. `--force`).
    pub fn upgrade_with(&self, values: &str, extra: &[&str]) {
        self.try_upgrade_with(values, extra)
            .unwrap_or_else(|stderr| panic!("helm upgrade {extra:?}: {stderr}"));
    }

    /// [`Release::upgrade_with`], its error output returned.
    pub fn try_upgrade_with(&self, values: &str, extra: &[&str]) -> Result<String, String> {
        let file = self.values(values);
        let chart = chart().display().to_string();
        let mut args = vec!["upgrade", &self.name, &chart, "-n", &self.namespace, "-f", &file];
        args.extend_from_slice(extra);
        self.try_helm(&args)
    }

    /// A guard that uninstalls the release (without hooks) when dropped,
    /// even when its test failed: a release's cluster-wide `Fail` webhooks
    /// must not outlive the servers that answer them, nor reach the other
    /// tests of the binary, which share its control plane. Uninstalling a
    /// release that is already gone does nothing.
    pub fn uninstall_on_drop(&self) -> Uninstall {
        Uninstall {
            home: self.home.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            kubeconfig: self.kubeconfig.clone(),
        }
    }

    /// The installed Deployment's container arguments, on this machine
    /// ([`on_this_machine`], with the mounted files read from `dir`).
    pub fn server_args(&self, dir: &Path) -> Vec<String> {
        let manifest = self.helm(&["get", "manifest", &self.name, "-n", &self.namespace]);
        on_this_machine(&container_args(&manifest, "Deployment"), dir)
    }

    /// The release's server as its pod runs it: the installed Deployment's
    /// arguments (with the mounted files read from `dir`) and the
    /// kubeconfig of the ServiceAccount `service_account`.
    pub async fn pod(&self, cluster: &cluster::Cluster, dir: &Path, service_account: &str) -> Pod {
        Pod {
            args: self.server_args(dir),
            kubeconfig: cluster
                .service_account_kubeconfig(&self.namespace, service_account)
                .await,
        }
    }

    /// Runs the pre-delete hook's command as its Job's pod would (there is
    /// no kubelet here), with `kubeconfig` (the chart's ServiceAccount);
    /// asserts it succeeded and returns what it printed.
    pub fn run_pre_delete_hook(&self, kubeconfig: &Path) -> String {
        let (succeeded, said) = self.run_hook("Job", kubeconfig, &[]);
        assert!(succeeded, "{said}");
        said
    }

    /// Runs the `helm test` hook's command as its pod would, with `extra`
    /// arguments; returns whether it succeeded and what it printed.
    pub fn run_test_hook(&self, kubeconfig: &Path, extra: &[&str]) -> (bool, String) {
        self.run_hook("Pod", kubeconfig, extra)
    }

    fn run_hook(&self, kind: &str, kubeconfig: &Path, extra: &[&str]) -> (bool, String) {
        let hooks = self.helm(&["get", "hooks", &self.name, "-n", &self.namespace]);
        let output = Command::new(env!("CARGO_BIN_EXE_statusguard"))
            .args(container_args(&hooks, kind))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), said)
    }
}

/// Uninstalls a [`Release`] when dropped ([`Release::uninstall_on_drop`]).
#[must_use = "the release is uninstalled when the guard is dropped"]
pub struct Uninstall {
    home: PathBuf,
    name: String,
    namespace: String,
    kubeconfig: PathBuf,
}

impl Drop for Uninstall {
    fn drop(&mut self) {
        // No hooks: the pre-delete Job has no kubelet to run it here. Its
        // output is not checked: a drop may run during a panic.
        let _ = helm(&self.home)
            .args([
                "uninstall",
                &self.name,
                "-n",
                &self.namespace,
                "--no-hooks",
                "--kubeconfig",
            ])
            .arg(&self.kubeconfig)
            .output();
    }
}

/// A pod of a [`Release`]: what the binary needs to start as the chart's pod would.
pub struct Pod {
    pub args: Vec<String>,
    pub kubeconfig: PathBuf,
}

impl Pod {
    /// Starts the binary on TLS port `port`, its files in `dir`.
    pub async fn start_on(&self, port: u16, dir: &Path) -> BinaryServer {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let env = [("KUBECONFIG", self.kubeconfig.as_path())];
        BinaryServer::start_on(port, dir, &args, &env).await
    }

    /// Two replicas started at once on `ports`, with directories `a` and `b`
    /// of `home`, each ready.
    pub async fn start_two_ready(&self, ports: (u16, u16), home: &Path) -> (BinaryServer, BinaryServer) {
        let (dir_a, dir_b) = (home.join("a"), home.join("b"));
        std::fs::create_dir_all(&dir_a).unwrap();
        std::fs::create_dir_all(&dir_b).unwrap();
        let (a, b) = tokio::join!(self.start_on(ports.0, &dir_a), self.start_on(ports.1, &dir_b));
        a.wait_ready().await;
        b.wait_ready().await;
        (a, b)
    }
}
