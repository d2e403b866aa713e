//! `statusguard suggest`: the objects and observed writes fetched, the
//! drafts made ([`crate::tools::suggest`]) and printed.

use std::process::ExitCode;

use anyhow::Context as _;

use super::cluster_client;
use crate::cli::args::SuggestArgs;
use crate::tools::suggest::{draft, fetch, render, split_resource_name};

pub(crate) async fn run(args: &SuggestArgs) -> anyhow::Result<ExitCode> {
    let client = cluster_client().await?;
    let mut observed = Vec::new();
    for source in &args.observed {
        observed.push(fetch::observed(source).await?);
    }
    let mut drafts = Vec::new();
    for name in &args.resources {
        let (group, resource) = split_resource_name(name);
        let objects = fetch::objects(&client, &group, &resource, args.namespace.as_deref(), &args.conditions).await?;
        drafts.push(draft(&group, &resource, &args.conditions, &objects, &observed));
    }
    let text = render(&drafts).context("the draft is not a valid document (a bug: please report it)")?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
