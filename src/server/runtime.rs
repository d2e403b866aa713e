//! The async runtime the server runs on: tokio's multi-threaded scheduler,
//! with its LIFO slot turned off where the build allows it.
//!
//! Why: a worker runs a task woken by the task it is running next, before
//! any other ready task (the "LIFO slot"). Over HTTP/2 the task that wakes
//! a connection is a stream's handler sending its answer, so each answer
//! was written alone, as soon as it was decided, while the connection's
//! other streams waited to be decided: one write and one wake-up of the
//! idle caller per answer. Without the slot, ready tasks run in the order
//! they were woken: the connection writes after the streams it had ready
//! were decided, the answers go out back to back, and the caller is woken
//! once for them. Measured side by side with the issue-12 fixture's denial
//! over HTTP/2 (4 connections x 8 streams; BENCHMARKS.md, "answers written
//! together"), the server's CPU per review fell from 55.5–57.8 to
//! 48.2–48.9 µs and its p99 latency from 2.6–2.7 to 2.0 ms. (Over HTTP/1.1,
//! a task per connection, the answer's yield in `http::admission` does it.)
//!
//! `disable_lifo_slot` is one of tokio's unstable options: the build passes
//! `--cfg tokio_unstable` (`.cargo/config.toml`, `Dockerfile`,
//! `image/build.sh`). A build without it (`RUSTFLAGS` set by hand replaces
//! the configured flags) runs with the slot, which decides the same and
//! costs more; [`LIFO_SLOT_OFF`] says which one this is, and `serve` logs it.

use std::io;

/// Whether this build turns the LIFO slot off (built with `--cfg tokio_unstable`).
pub const LIFO_SLOT_OFF: bool = cfg!(tokio_unstable);

/// The runtime `statusguard` runs every command on.
pub fn build() -> io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

#[cfg(test)]
mod tests {
    /// The project's own builds (`cargo test`, `cargo build`) carry the flag
    /// from `.cargo/config.toml`: losing it would lose the batching silently.
    #[test]
    // Constant in each build, but not across builds: that is what it checks.
    #[allow(clippy::assertions_on_constants)]
    fn the_projects_builds_turn_the_lifo_slot_off() {
        assert!(
            super::LIFO_SLOT_OFF,
            "built without --cfg tokio_unstable: see .cargo/config.toml"
        );
        assert!(super::build().is_ok());
    }
}
