//! Server-managed registration: the webhook configurations follow the rules
//! in force ([`crate::webhooks`]).
//!
//! Every replica runs this loop and applies the same objects with the same
//! field manager, so they converge without a leader. It applies when the
//! rules are replaced, when the CA file changes, and every resync interval
//! (which repairs a hand edit or deletion); it applies nothing before the
//! first valid document, and nothing while the ownership ConfigMap stands
//! the servers down (`statusguard unregister`).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::time::Instant;

use crate::server::app::App;
use crate::webhooks::{self, Registration};

/// How often the CA file is looked at between other wake-ups.
const CA_POLL: Duration = Duration::from_secs(2);

/// What was last applied: the rules generation and the CA bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    generation: u64,
    ca_bundle: Option<Vec<u8>>,
}

/// What the loop last reported, so that a state is logged (and counted) once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reported {
    Nothing,
    Waiting,
    StoodDown,
    Failed(String),
    Applied,
}

/// Keeps the webhook configurations in step with the rules until the
/// process ends.
pub async fn keep_registered(client: Client, registration: Registration, app: Arc<App>) {
    let mut applied: Option<Applied> = None;
    let mut applied_at = Instant::now();
    let mut reported = Reported::Nothing;
    tracing::info!(name = %registration.name, target = ?registration.target, "keeping the webhook configurations in step with the rules");
    loop {
        reported = sync(&client, &registration, &app, &mut applied, &mut applied_at, &reported).await;
        tokio::select! {
            () = app.rules.replaced() => {},
            () = app.registration_changed() => {},
            () = tokio::time::sleep(CA_POLL) => {},
        }
    }
}

async fn sync(
    client: &Client,
    registration: &Registration,
    app: &App,
    applied: &mut Option<Applied>,
    applied_at: &mut Instant,
    reported: &Reported,
) -> Reported {
    let metrics = &app.metrics;
    if !app.registration_enabled() {
        if *reported != Reported::StoodDown {
            tracing::warn!(name = %registration.name, "the ownership ConfigMap stands the servers down (statusguard unregister): the webhook configurations are not applied");
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
    let managed = app.trust_bundle();
    let ca_bundle = match registration.ca_bundle(managed.as_deref().map(Vec::as_slice)) {
        Ok(bundle) => bundle,
        Err(e) => return failed(app, reported, e.to_string()),
    };
    let wanted = Applied {
        generation: app.rules.generation(),
        ca_bundle,
    };
    if applied.as_ref() == Some(&wanted) && applied_at.elapsed() < registration.resync {
        return reported.clone();
    }
    let configurations = webhooks::desired(registration, &rules, wanted.ca_bundle.as_deref());
    match webhooks::apply(client, &configurations).await {
        Ok(()) => {
            if applied.as_ref() != Some(&wanted) {
                tracing::info!(name = %registration.name, generation = wanted.generation, summary = %rules.summary(), "webhook configurations applied");
            }
            metrics.webhook_sync("applied", Some(wanted.generation));
            *applied = Some(wanted);
            *applied_at = Instant::now();
            Reported::Applied
        }
        Err(e) => failed(app, reported, e.to_string()),
    }
}

fn failed(app: &App, reported: &Reported, error: String) -> Reported {
    if *reported != Reported::Failed(error.clone()) {
        tracing::warn!(%error, "cannot apply the webhook configurations; retrying (what is registered stays)");
    }
    app.metrics.webhook_sync("error", None);
    Reported::Failed(error)
}
