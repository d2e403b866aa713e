//! `statusguard export policies`: the ownership document as admission
//! policies, printed as one YAML stream (deterministic, for GitOps).

use std::process::ExitCode;

use super::print_out;
use crate::cli::args::ExportPoliciesArgs;
use crate::policies;
use crate::rules::RulesSource;

pub(crate) async fn run(args: &ExportPoliciesArgs) -> ExitCode {
    let source = match (&args.ownership, &args.configmap) {
        (Some(file), _) => RulesSource::File(file.clone()),
        (None, Some(configmap)) => RulesSource::ConfigMap(configmap.clone()),
        (None, None) => {
            eprintln!("statusguard export policies: give --ownership FILE or --configmap NAMESPACE/NAME");
            return ExitCode::from(2);
        }
    };
    let rules = match super::check::load(&source).await {
        Ok(rules) => rules,
        Err(problems) => {
            eprintln!("{source}: invalid:");
            for problem in problems {
                eprintln!("  - {problem}");
            }
            return ExitCode::from(1);
        }
    };
    let too_long = policies::name_problems(&args.name, &rules);
    if !too_long.is_empty() {
        eprintln!("{source}: the policies cannot be named:");
        for problem in too_long {
            eprintln!("  - {problem}");
        }
        return ExitCode::from(1);
    }
    let deviations = policies::deviations(&rules);
    if !deviations.is_empty() {
        let verdict = if args.allow_deviations {
            "exported anyway (--allow-deviations)"
        } else {
            "not exported"
        };
        eprintln!("{source}: the policies would decide differently from the webhook; {verdict}:");
        for deviation in &deviations {
            eprintln!("  - {deviation}");
        }
        if !args.allow_deviations {
            eprintln!("give --allow-deviations to export them as they are (README: \"Webhook or policies?\")");
            return ExitCode::from(1);
        }
    }
    let mut text = format!("# statusguard export policies, from {source}\n");
    for object in policies::policies(&args.name, &rules) {
        match serde_saphyr::to_string(&object) {
            Ok(yaml) => text += &format!("---\n{yaml}"),
            Err(e) => {
                eprintln!("statusguard export policies: cannot write YAML: {e}");
                return ExitCode::from(1);
            }
        }
    }
    print_out(&text);
    ExitCode::SUCCESS
}
