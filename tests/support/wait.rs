//! Waiting in tests: the one polling loop and the one free-port picker.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// Calls `attempt` every 100 ms until it returns `Ok`, for at most `limit`;
/// then panics naming `what` and the last error.
pub async fn retry_until<T, E, F, Fut>(limit: Duration, what: &str, mut attempt: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(last) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {limit:?} waiting for: {what} (last: {last:?})"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `check` until it returns true, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    retry_until(limit, what, || {
        let checked = check();
        async move { if checked.await { Ok(()) } else { Err("not yet") } }
    })
    .await
}

/// A loopback port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}
