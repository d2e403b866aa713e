//! `statusguard check`: validate an ownership document (a file, or a live
//! ConfigMap as the server would read it) and list what it guards.

use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;

use super::{cluster_client, print_out};
use crate::cli::args::CheckArgs;
use crate::ownership::{Ownership, ResourceRules};
use crate::rules::{LoadError, RulesSource};

pub(crate) async fn run(args: &CheckArgs) -> ExitCode {
    let source = match (&args.file, &args.configmap) {
        (Some(file), _) => RulesSource::File(file.clone()),
        (None, Some(configmap)) => RulesSource::ConfigMap(configmap.clone()),
        (None, None) => {
            eprintln!("statusguard check: give FILE or --configmap NAMESPACE/NAME");
            return ExitCode::from(2);
        }
    };
    let origin = source.to_string();
    match load(&source).await {
        Ok(rules) => {
            let mut text = format!("{origin}: valid: {}\n", rules.summary());
            for r in rules.resources() {
                text += &format!(
                    "  {} (mode {}, conditions at status.{}, {})\n",
                    r.name(),
                    r.mode,
                    r.conditions_path,
                    version_note(r)
                );
                for w in &r.writers {
                    let fields: Vec<String> = w.fields.iter().map(ToString::to_string).collect();
                    text += &format!(
                        "    {}: fields [{}], conditions [{}]\n",
                        w.username,
                        fields.join(", "),
                        w.conditions.join(", ")
                    );
                }
            }
            if args.file.is_some() {
                text += &writer_hints(&rules).await;
            }
            for note in crate::policies::depth_notes(&rules) {
                text += &format!("note: {note}\n");
            }
            let deviations = crate::policies::deviations(&rules);
            if !deviations.is_empty() {
                text += "warning: as policies (`statusguard export policies`), this document would be decided \
                         differently from the webhook (README, \"Webhook or policies?\"):\n";
                for deviation in deviations {
                    text += &format!("  - {deviation}\n");
                }
            }
            print_out(&text);
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{origin}: invalid:");
            for problem in problems {
                eprintln!("  - {problem}");
            }
            ExitCode::from(1)
        }
    }
}

/// The document of `source`, from the cluster (in-cluster config, or
/// KUBECONFIG) for a ConfigMap; else every problem found in it.
pub(super) async fn load(source: &RulesSource) -> Result<Ownership, Vec<String>> {
    match source {
        RulesSource::ConfigMap(_) => match cluster_client().await {
            Ok(client) => source.load(&client).await.map_err(problems),
            Err(e) => Err(vec![e.to_string()]),
        },
        local => local.load_local().map_err(problems),
    }
}

/// The problems of a load, the source named once, in the heading.
fn problems(error: LoadError) -> Vec<String> {
    match error {
        LoadError::Invalid { source, .. } => source.problems(),
        other => other.problems(),
    }
}

/// Which version a resource's webhook rule will name, for `check`.
fn version_note(r: &ResourceRules) -> String {
    match &r.version {
        Some(version) => format!("version {version}"),
        // A CRD's group has a dot; a group without one is built in.
        None if !r.group.contains('.') => {
            "every version (*): a built-in resource has no CRD to take it from, so writes are not converted; set version:"
                .to_owned()
        }
        None => "version: its CRD's storage version, read by the server (every version, *, while there is no CRD)"
            .to_owned(),
    }
}

/// When a cluster is reachable (in-cluster config or KUBECONFIG), a hint for
/// every service-account writer that does not exist there: a misspelled
/// writer owns nothing the webhook will ever see. Silent when no cluster is
/// configured; never an error.
async fn writer_hints(rules: &Ownership) -> String {
    let Ok(client) = cluster_client().await else {
        return String::new();
    };
    let mut accounts: Vec<(&str, &str)> = rules
        .resources()
        .iter()
        .flat_map(|r| &r.writers)
        .filter_map(|w| w.username.strip_prefix("system:serviceaccount:")?.split_once(':'))
        .collect();
    accounts.sort();
    accounts.dedup();
    let lookups = async {
        let mut hints = String::new();
        for (namespace, name) in accounts {
            let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    hints += &format!("  hint: ServiceAccount {namespace}/{name} does not exist in the cluster\n")
                }
                Err(e) => return format!("  (cluster hints skipped: {e})\n"),
            }
        }
        hints
    };
    tokio::time::timeout(Duration::from_secs(10), lookups)
        .await
        .unwrap_or_else(|_| "  (cluster hints skipped: the cluster did not answer in 10 s)\n".to_owned())
}
