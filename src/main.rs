//! The `statusguard` binary: parse the command line, set up logging, run.

#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::Parser as _;
use statusguard::cli::{Cli, init_logging, run};

/// jemalloc, configured in .cargo/config.toml (one arena, freed pages
/// purged from a background thread): glibc's malloc keeps what a burst of
/// large reviews took, in one arena per thread.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
