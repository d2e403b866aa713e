//! The bodies of the commands, one file each.

use anyhow::Context as _;

pub(super) mod check;
pub(super) mod gen_certs;
pub(super) mod probe;
pub(super) mod review;
pub(super) mod serve;
pub(super) mod suggest;
pub(super) mod unregister;

/// A client of the cluster the environment names (in-cluster config, or
/// KUBECONFIG): how every command that reads or changes the cluster reaches it.
async fn cluster_client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("cannot reach the Kubernetes API (in-cluster config, or KUBECONFIG)")
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print_out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
