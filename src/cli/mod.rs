//! The command line, one command per file under `commands`:
//! - `serve`: the TLS admission webhook;
//! - `check`: validate an ownership document, a file or a live ConfigMap;
//! - `review`: answer one AdmissionReview offline, as the server would;
//! - `gen-certs`: a development CA and serving certificate;
//! - `unregister`: remove the webhook configurations and stand the servers down;
//! - `probe`: call each registered webhook as the API server does (`helm test`);
//! - `suggest`: draft an ownership document from who writes what today;
//! - `export policies`: the document as admission policies, no webhook.
//!
//! `args` holds what clap parses; this module sets up logging and
//! dispatches.

use std::io::IsTerminal as _;
use std::process::ExitCode;

pub(crate) mod args;
mod commands;

pub use args::Cli;
use args::{Command, LogFormat};

/// Sets up logging to stderr in the chosen format; colour only when stderr
/// is a terminal, so a file or a pipe gets no escape codes.
pub fn init_logging(format: LogFormat, filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Runs a parsed command line. `on_second_signal` runs when `serve` gets a
/// second SIGTERM or SIGINT while it drains (the binary exits at once).
pub async fn run(cli: Cli, on_second_signal: impl FnOnce() + Send + 'static) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => commands::serve::run(args, on_second_signal).await,
        Command::Check(args) => Ok(commands::check::run(&args).await),
        Command::Review(args) => Ok(commands::review::run(&args)),
        Command::GenCerts(args) => commands::gen_certs::run(&args),
        Command::Unregister(args) => commands::unregister::run(&args).await,
        Command::Probe(args) => commands::probe::run(args).await,
        Command::Suggest(args) => commands::suggest::run(&args).await,
        Command::Export(args::ExportCommand::Policies(args)) => Ok(commands::export::run(&args).await),
    }
}
