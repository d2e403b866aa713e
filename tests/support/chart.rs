//! The Helm chart as the tests use it: helm with a home of its own, rendered
//! manifests, and the arguments the chart gives its containers, mapped onto
//! this machine so that a test runs the binary exactly as a pod would.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::cluster;

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
        .args(["-n", namespace, "-f"])
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
/// (Deployment, Job) in the manifests.
pub fn container_args(manifests: &str, kind: &str) -> Vec<String> {
    let docs = documents(manifests);
    let object = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"));
    object["spec"]["template"]["spec"]["containers"][0]["args"]
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
