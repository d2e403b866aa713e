//! The bodies of the commands, one file each.

pub(super) mod check;
pub(super) mod export;
pub(super) mod gen_certs;
pub(super) mod probe;
pub(super) mod review;
pub(super) mod serve;
pub(super) mod suggest;
pub(super) mod unregister;

/// The client's error is printed, not chained as a source: its message
/// already holds its causes, which a chain would print again.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the Kubernetes API (in-cluster config, or KUBECONFIG): {0}")]
struct ClusterUnreachable(kube::Error);

/// A client of the cluster the environment names (in-cluster config, or
/// KUBECONFIG): how every command that reads or changes the cluster reaches it.
async fn cluster_client() -> Result<kube::Client, ClusterUnreachable> {
    kube::Client::try_default().await.map_err(ClusterUnreachable)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print_out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
