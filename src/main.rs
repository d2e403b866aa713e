//! The `statusguard` binary: parse the command line, set up logging, run.

#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::Parser as _;
use statusguard::cli::{Cli, init_logging, run};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, &cli.log_level);
    // A second SIGTERM or SIGINT while `serve` drains: stop at once.
    match run(cli, || std::process::exit(130)).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("statusguard: {e:#}");
            ExitCode::FAILURE
        }
    }
}
