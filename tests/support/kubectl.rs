//! The real kubectl, built from the pinned k8s.io/kubernetes release by
//! tests/clients/kubectl.sh (tests/run.sh exports STATUSGUARD_KUBECTL).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// kubectl's path; a test that needs it fails here, saying why, when it
/// cannot be built.
pub fn path() -> PathBuf {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PATH.get_or_init(|| super::printed_path("tests/clients/kubectl.sh")) {
        Ok(path) => path.clone(),
        Err(e) => panic!("this test drives the real kubectl, which could not be built: {e}"),
    }
}

/// Runs kubectl with `args` against the cluster of `kubeconfig`; its output
/// as text (stdout, stderr) and whether it succeeded.
pub fn run(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let Output { status, stdout, stderr } = Command::new(path())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}
