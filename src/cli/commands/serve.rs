//! `statusguard serve`: the flags translated into the server's
//! configuration, in [`config`], then the server run until a signal.

use std::process::ExitCode;

use crate::cli::args::ServeArgs;
use crate::cluster::certs::files::CertFiles;
use crate::cluster::certs::policy::{CertPolicy, names_for};
use crate::cluster::certs::secret::ManagedCerts;
use crate::cluster::observer::ObserveConfig;
use crate::cluster::registration::desired::{CaSource, Registration};
use crate::cluster::registration::policies::PolicyRegistration;
use crate::rules::RulesSource;
use crate::server::Server;
use crate::server::config::{CertSource, ServeConfig};
use crate::server::limits::Limits;
use crate::server::shutdown::shutdown_signal;

pub(crate) async fn run(args: ServeArgs, on_second_signal: impl FnOnce() + Send + 'static) -> anyhow::Result<ExitCode> {
    let server = Server::bind(config(args)).await?;
    server.run(shutdown_signal(on_second_signal)).await;
    Ok(ExitCode::SUCCESS)
}

/// The server's configuration from the flags: every translation of a flag
/// into what the server holds is here, and only here.
pub(crate) fn config(args: ServeArgs) -> ServeConfig {
    let rules = match (args.ownership, args.configmap) {
        (Some(path), _) => RulesSource::File(path),
        (None, Some(configmap)) => RulesSource::ConfigMap(configmap),
        (None, None) => RulesSource::Embedded,
    };

    let tls = args.tls;

    // Managed certificates are valid for the webhook target's names and --cert-name.
    let certs = args.managed_certs;
    let webhooks = args.webhooks;
    let managed_certs = certs.manage_certificates.map(|secret| {
        let mut names = webhooks
            .webhook_target
            .as_ref()
            .map(|target| names_for(target, &[]))
            .unwrap_or_default();
        names.extend(certs.cert_names.into_iter().filter(|name| !name.is_empty()));
        ManagedCerts {
            secret,
            policy: CertPolicy {
                names,
                leaf_validity: certs.cert_validity,
                ca_validity: certs.ca_validity,
                overlap: certs.cert_overlap,
            },
            check_interval: certs.cert_check_interval,
        }
    });

    // Without --webhook-ca-file, the caBundle is that of the certificates
    // the server keeps itself, if it does.
    let ca = match (webhooks.webhook_ca_file, managed_certs.is_some()) {
        (Some(path), _) => CaSource::File(path),
        (None, true) => CaSource::Managed,
        (None, false) => CaSource::None,
    };
    let registration = match (webhooks.register_webhooks, webhooks.webhook_target) {
        (Some(name), Some(target)) => Some(Registration {
            name,
            target,
            ca,
            failure_policy: webhooks.webhook_failure_policy,
            timeout_seconds: webhooks.webhook_timeout_seconds,
            namespace_selector: webhooks.webhook_namespace_selector,
            object_selector: webhooks.webhook_object_selector,
            resync: webhooks.webhook_resync,
            // Server::bind sets it from the rules source.
            ownership_configmap: None,
        }),
        _ => None,
    };
    let policy_registration = webhooks.register_policies.map(|name| PolicyRegistration {
        name,
        allow_deviations: webhooks.register_policies_allow_deviations,
        resync: webhooks.webhook_resync,
    });

    // One certificate source: the Secret the server keeps, files, or one
    // generated at start.
    let certs = match (managed_certs, tls.tls_cert, tls.tls_key) {
        (Some(managed), _, _) => CertSource::Secret(managed),
        (None, Some(cert), Some(key)) => CertSource::Files(CertFiles { cert, key }),
        (None, _, _) => CertSource::Generated {
            sans: tls.tls_sans,
            write_ca: tls.write_ca,
        },
    };
    let limits = args.limits;
    let observe = args.observe;
    ServeConfig {
        rules,
        listen: args.listen,
        admin_listen: args.admin_listen,
        certs,
        tls_reload_interval: tls.tls_reload_interval,
        limits: Limits {
            max_body_bytes: limits.max_body_bytes,
            max_inflight_bytes: limits.max_inflight_bytes,
            max_inflight_requests: limits.max_inflight_requests,
            max_connections: limits.max_connections,
            decision_threads: limits
                .decision_threads
                .unwrap_or_else(|| Limits::default().decision_threads),
            header_read_timeout: limits.header_read_timeout,
            request_timeout: limits.request_timeout,
        },
        client_ca_file: tls.client_ca_file,
        shutdown_delay: args.shutdown_delay,
        shutdown_timeout: args.shutdown_timeout,
        registration,
        policy_registration,
        observe: ObserveConfig {
            rate_per_second: observe.observe_rate,
            bytes_per_second: observe.observe_bytes_rate,
            max_identities: observe.observe_max_identities,
            event_interval: observe.events.then_some(observe.event_interval),
            event_rate_per_second: observe.event_rate,
            event_burst: observe.event_burst,
            queue_bytes: observe.observe_queue_bytes,
            ..Default::default()
        },
    }
}
