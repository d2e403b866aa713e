//! Server-managed registration: the webhook configurations follow the rules
//! in force ([`crate::webhooks`]).
//!
//! Every replica runs this loop and applies the same objects with the same
//! field manager, so they converge without a leader. It applies when the
//! rules are replaced, when the CA file changes, and every resync interval
//! (which repairs a hand edit or deletion); it applies nothing before the
//! first valid document, and nothing while the ownership ConfigMap stands
//! the servers down (`statusguard unregister`).
//!
//! Each rule names the version its resource's paths are written against: the
//! document's `version:`, else its CRD's storage version, which a watch of
//! the CRDs ([`crds`]) keeps current; the loop applies again when one changes
//! or a CRD appears. A resource with neither is registered for every version
//! (`*`), and the log says so.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::server::app::App;
use crate::server::crds::{self, Resolution, StorageVersions};
use crate::webhooks::{self, Registration};

/// How often the CA file is looked at between other wake-ups.
const CA_POLL: Duration = Duration::from_secs(2);

/// What was last applied: the rules generation, the CA bundle and the
/// versions found for the resources whose document names none.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    generation: u64,
    ca_bundle: Option<Vec<u8>>,
    resolution: Resolution,
}

/// What the loop last reported, so that a state is logged (and counted) once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Nothing,
    Waiting,
    ListingCrds,
    StoodDown,
    Failed(String),
    Applied,
}

/// Keeps the webhook configurations in step with the rules, and the CRDs'
/// storage versions, until the process ends.
pub async fn keep_registered(client: Client, registration: Registration, app: Arc<App>) {
    let (versions_found, storage_versions) = watch::channel(StorageVersions::default());
    tokio::join!(
        crds::watch_storage_versions(client.clone(), versions_found),
        register(client, registration, app, storage_versions),
    );
}

async fn register(
    client: Client,
    registration: Registration,
    app: Arc<App>,
    mut storage_versions: watch::Receiver<StorageVersions>,
) {
    let mut applied: Option<Applied> = None;
    let mut applied_at = Instant::now();
    let mut reported = Reported::Nothing;
    tracing::info!(name = %registration.name, target = ?registration.target, "keeping the webhook configurations in step with the rules");
    loop {
        let known = storage_versions.borrow_and_update().clone();
        reported = sync(
            &client,
            &registration,
            &app,
            &known,
            &mut applied,
            &mut applied_at,
            &reported,
        )
        .await;
        tokio::select! {
            () = app.rules.replaced() => {},
            () = app.registration_changed() => {},
            Ok(()) = storage_versions.changed() => {},
            () = tokio::time::sleep(CA_POLL) => {},
        }
    }
}

async fn sync(
    client: &Client,
    registration: &Registration,
    app: &App,
    known: &StorageVersions,
    applied: &mut Option<Applied>,
    applied_at: &mut Instant,
    reported: &Reported,
) -> Reported {
    let metrics = &app.metrics;
    if !app.registration_enabled() {
        if *reported != Reported::StoodDown {
            tracing::warn!(name = %registration.name, "statusguard.dev/registration: disabled, on the ownership ConfigMap or its state ConfigMap, stands the servers down (statusguard unregister, or the runbook): the webhook configurations are not applied");
            metrics.webhook_sync("stood_down", None);
        }
        *applied = None;
        return Reported::StoodDown;
    }
    let Some(rules) = app.rules.current() else {
        if *reported != Reported::Waiting {
            let why = app.rules.problem().map(|p| p.to_string()).unwrap_or_default();
            tracing::warn!(name = %registration.name, %why, "no valid ownership rules yet: no webhook configuration is applied, nothing is intercepted");
            metrics.webhook_sync("waiting", None);
        }
        return Reported::Waiting;
    };
    let Some(resolution) = crds::resolve(&rules, known) else {
        if *reported != Reported::ListingCrds {
            tracing::info!(name = %registration.name, "listing the CRDs for the storage versions of the resources without version: before any webhook configuration is applied");
        }
        return Reported::ListingCrds;
    };
    let managed = app.trust_bundle();
    let ca_bundle = match registration.ca_bundle(managed.as_deref().map(Vec::as_slice)) {
        Ok(bundle) => bundle,
        Err(e) => return failed(app, reported, e.to_string()),
    };
    let wanted = Applied {
        generation: app.rules.generation(),
        ca_bundle,
        resolution,
    };
    if applied.as_ref() == Some(&wanted) && applied_at.elapsed() < registration.resync {
        return reported.clone();
    }
    let configurations = webhooks::desired(
        registration,
        &rules,
        &wanted.resolution.versions,
        wanted.ca_bundle.as_deref(),
    );
    match webhooks::apply(client, &configurations).await {
        Ok(()) => {
            if applied.as_ref() != Some(&wanted) {
                tracing::info!(name = %registration.name, generation = wanted.generation, summary = %rules.summary(), "webhook configurations applied");
                if applied.as_ref().map(|a| (a.generation, &a.resolution))
                    != Some((wanted.generation, &wanted.resolution))
                {
                    log_versions(&rules, &wanted.resolution);
                }
            }
            metrics.webhook_sync("applied", Some(wanted.generation));
            *applied = Some(wanted);
            *applied_at = Instant::now();
            Reported::Applied
        }
        Err(e) => failed(app, reported, e.to_string()),
    }
}

/// One line per resource: the version its rule names, and where it comes
/// from; a warning for each registered for every version.
fn log_versions(rules: &crate::ownership::Ownership, resolution: &Resolution) {
    for r in rules.resources() {
        let resource = r.name();
        let key = crate::ownership::GroupResource::new(r.group.as_str(), r.resource.as_str());
        if let Some(version) = &r.version {
            tracing::info!(%resource, %version, "the webhook rule names the document's version: writes in other versions are converted to it");
        } else if let Some(version) = resolution.versions.get(&key) {
            tracing::info!(%resource, %version, "the webhook rule names the CRD's storage version: writes in other versions are converted to it");
        } else if let Some(why) = resolution.unversioned.get(&key) {
            tracing::warn!(%resource, %why, "the webhook rule names every version (*): writes are not converted, and the paths are read in whatever version a writer uses; name version: in the document");
        }
    }
}

fn failed(app: &App, reported: &Reported, error: String) -> Reported {
    if *reported != Reported::Failed(error.clone()) {
        tracing::warn!(%error, "cannot apply the webhook configurations; retrying (what is registered stays)");
    }
    app.metrics.webhook_sync("error", None);
    Reported::Failed(error)
}
