//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod chart;
pub mod cluster;
pub mod gateway;
pub mod kubectl;
pub mod legacy;
pub mod mtls;
pub mod scenario;
pub mod wait;
pub mod webhook;

/// The path a pinned-tool script of the tests prints with `--print` (it
/// builds or fetches what is missing first, or takes its environment
/// variable's path), e.g. `tests/clients/kubectl.sh`.
pub fn printed_path(script: &str) -> Result<std::path::PathBuf, String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}); see its message above",
            script.display(),
            output.status
        ));
    }
    Ok(std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}
