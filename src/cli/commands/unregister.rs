//! `statusguard unregister`: the recovery when statusguard is gone and
//! guarded status writes fail. Deletes the webhook configurations and
//! annotates the ownership ConfigMap so that running servers do not apply
//! them again.

use std::process::ExitCode;

use anyhow::Context as _;

use super::{cluster_client, print_out};
use crate::cli::args::UnregisterArgs;

pub(crate) async fn run(args: &UnregisterArgs) -> anyhow::Result<ExitCode> {
    let client = cluster_client().await?;
    let done =
        crate::cluster::registration::unregister::unregister(&client, &args.name, args.configmap.as_ref(), args.settle)
            .await
            .context("cannot unregister")?;
    let mut text = String::new();
    if let Some(configmap) = &done.stood_down {
        text +=
            &format!("stood the servers down: ConfigMap {configmap} annotated statusguard.dev/registration=disabled\n");
    }
    for deleted in &done.deleted {
        text += &format!("deleted {deleted}\n");
    }
    if done.deleted.is_empty() {
        text += &format!(
            "no webhook configuration or admission policy named {} was registered\n",
            args.name
        );
    }
    print_out(&text);
    Ok(ExitCode::SUCCESS)
}
