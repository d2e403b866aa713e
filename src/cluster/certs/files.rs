//! Serving certificates and client CAs from files (`--tls-cert`/`--tls-key`,
//! `--client-ca-file`), polled for a change and swapped in without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::sign::CertifiedKey;

use crate::cluster::certs::tls::{
    PemPair, SwappableCert, SwappableClientVerifier, TlsError, certified_key, client_verifier,
};

/// The PEM bundle of the CAs whose client certificates are accepted
/// (`--client-ca-file`), re-read every interval like [`CertFiles`], so a
/// rotated ConfigMap or Secret volume takes effect without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCaFile {
    /// The PEM bundle.
    pub path: PathBuf,
}

impl ClientCaFile {
    /// Loads the bundle once, for start-up: the verifier, and the bytes it came from.
    pub fn load(&self) -> Result<(Arc<SwappableClientVerifier>, Vec<u8>), TlsError> {
        let pem = self.read()?;
        let verifier = client_verifier(&pem, &self.path)?;
        Ok((SwappableClientVerifier::new(verifier), pem))
    }

    /// Polls the file until the process ends, swapping in each new valid
    /// bundle; a bundle that does not load leaves the last good one in force.
    /// `on_reload` hears of every attempt, `Ok` or not.
    pub async fn watch(
        self,
        target: Arc<SwappableClientVerifier>,
        loaded: Vec<u8>,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        poll_files(&self, &target, loaded, interval, on_reload).await;
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Files that [`poll_files`] re-reads and swaps into a live `Target`.
trait Polled {
    /// What the files are, for the log.
    const WHAT: &'static str;
    type Files: PartialEq;
    type Target;
    fn read(&self) -> Result<Self::Files, TlsError>;
    fn install(&self, target: &Self::Target, files: &Self::Files) -> Result<(), TlsError>;
}

impl Polled for ClientCaFile {
    const WHAT: &'static str = "the client CA bundle";
    type Files = Vec<u8>;
    type Target = SwappableClientVerifier;
    fn read(&self) -> Result<Vec<u8>, TlsError> {
        read_file(&self.path)
    }
    fn install(&self, target: &SwappableClientVerifier, pem: &Vec<u8>) -> Result<(), TlsError> {
        target.store(client_verifier(pem, &self.path)?);
        tracing::info!(file = %self.path.display(), "trusting a new client CA bundle for new connections");
        Ok(())
    }
}

impl Polled for CertFiles {
    const WHAT: &'static str = "the TLS certificate and key";
    type Files = PemPair;
    type Target = SwappableCert;
    fn read(&self) -> Result<PemPair, TlsError> {
        Ok(PemPair {
            cert: read_file(&self.cert)?,
            key: read_file(&self.key)?,
            cert_origin: self.cert.clone(),
            key_origin: self.key.clone(),
        })
    }
    fn install(&self, target: &SwappableCert, pem: &PemPair) -> Result<(), TlsError> {
        target.store(certified_key(pem)?);
        tracing::info!(cert = %self.cert.display(), "serving a new TLS certificate");
        Ok(())
    }
}

/// Reads `what` every `interval` until the process ends, and installs each
/// new version that differs from the one in service. What fails to read or
/// install is reported (once per version), the last good one stays.
async fn poll_files<P: Polled>(
    files_of: &P,
    target: &P::Target,
    mut loaded: P::Files,
    interval: Duration,
    on_reload: impl Fn(Result<(), &TlsError>),
) {
    let what = P::WHAT;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The last version that failed to install, so that it is reported once.
    let mut rejected: Option<P::Files> = None;
    loop {
        tick.tick().await;
        let files = match files_of.read() {
            Ok(files) if files == loaded || rejected.as_ref() == Some(&files) => continue,
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read {what}; keeping the one in service");
                on_reload(Err(&e));
                continue;
            }
        };
        match files_of.install(target, &files) {
            Ok(()) => {
                loaded = files;
                on_reload(Ok(()));
            }
            Err(e) => {
                // A pair's other file may still be on its way: any later
                // change is tried again on a later tick.
                rejected = Some(files);
                tracing::warn!(error = %e, "{what}: the new version does not load; keeping the one in service");
                on_reload(Err(&e));
            }
        }
    }
}

/// Certificate and key files, re-read every `interval`.
///
/// Re-reading by path, rather than watching for file events, also follows
/// the `..data` symlink swap with which kubelet updates a Secret volume.
/// A pair that fails to load (a half-written rotation: new certificate, old
/// key) is reported and retried; the last good pair stays in service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

impl CertFiles {
    /// Loads the pair once, for start-up.
    pub fn load(&self) -> Result<(CertifiedKey, PemPair), TlsError> {
        let pem = self.read()?;
        Ok((certified_key(&pem)?, pem))
    }

    /// Polls the files until the process ends, swapping in each new valid pair.
    /// `on_reload` hears of every attempt, `Ok` or not.
    pub async fn watch(
        self,
        target: Arc<SwappableCert>,
        loaded: PemPair,
        interval: Duration,
        on_reload: impl Fn(Result<(), &TlsError>) + Send + 'static,
    ) {
        poll_files(&self, &target, loaded, interval, on_reload).await;
    }
}
