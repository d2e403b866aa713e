//! `statusguard probe`: every registered webhook called as the API server
//! calls it ([`crate::tools::probe`]), one line each; the exit code says
//! whether all answered right.

use std::process::ExitCode;

use super::cluster_client;
use crate::cli::args::ProbeArgs;
use crate::cluster::certs::files::CertFiles;
use crate::tools::probe::{ProbeOptions, failures, probe};

pub(crate) async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let client = cluster_client().await?;
    let client_cert = match (args.client_cert, args.client_key) {
        (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
        _ => None,
    };
    let options = ProbeOptions {
        name: args.name,
        configmap: args.configmap,
        connect_to: args.connect_to,
        timeout: args.timeout,
        client_cert,
    };
    let probed = probe(&client, &options).await?;
    for line in &probed {
        println!("{line}");
    }
    if probed.is_empty() {
        println!("no webhook is registered (the ownership document guards no resource): nothing to probe");
    }
    failures(&probed)?;
    Ok(ExitCode::SUCCESS)
}
