//! `statusguard review`: one AdmissionReview answered offline through the
//! server's own pipeline, so the answer is what the server would send.

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context as _;

use super::print_out;
use crate::admission::answer::{Verdict, answer};
use crate::cli::args::ReviewArgs;
use crate::ownership::Ownership;
use crate::rules::RulesSource;

pub(crate) fn run(args: &ReviewArgs) -> ExitCode {
    let (rules, body) = match read_review_inputs(args) {
        Ok(inputs) => inputs,
        Err(e) => {
            eprintln!("statusguard review: {e:#}");
            return ExitCode::from(2);
        }
    };
    let answer = answer(Some(&rules), &body, args.endpoint);
    match &answer.verdict {
        Verdict::Decided(_) => {
            print_out(&format!("{}\n", String::from_utf8_lossy(&answer.body)));
            ExitCode::SUCCESS
        }
        // What the server would send, and a non-zero exit: the input was bad.
        Verdict::Refused { reason, .. } => {
            print_out(&format!("{}\n", String::from_utf8_lossy(&answer.body)));
            eprintln!("statusguard review: cannot decide: {reason}");
            ExitCode::from(2)
        }
        Verdict::Failed { reason } => {
            eprintln!("statusguard review: {reason}");
            ExitCode::from(2)
        }
        Verdict::NotReady => ExitCode::from(2),
    }
}

fn read_review_inputs(args: &ReviewArgs) -> anyhow::Result<(Ownership, Vec<u8>)> {
    let rules = RulesSource::File(args.ownership.clone()).load_local()?;
    let body = if args.review.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin()
            .read_to_end(&mut body)
            .context("cannot read standard input")?;
        body
    } else {
        std::fs::read(&args.review).with_context(|| format!("cannot read {}", args.review.display()))?
    };
    Ok((rules, body))
}
