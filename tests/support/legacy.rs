//! The classic status write that statusguard exists to end, kept here (and
//! in `examples/shared_status.rs`) to show the rollback: a full Update of a
//! stale copy, and on 409 a refresh of only the resourceVersion, then the
//! same stale status again.

use kube::api::{Api, DynamicObject, PostParams};

/// Sends `staged` with `replace_status` up to `attempts` times, refreshing
/// only the resourceVersion after each conflict. Returns the attempts used.
pub async fn replace_status_with_naive_retry(
    api: &Api<DynamicObject>,
    staged: &mut DynamicObject,
    attempts: u32,
) -> Result<u32, kube::Error> {
    let name = staged.metadata.name.clone().unwrap_or_default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api.replace_status(&name, &PostParams::default(), &*staged).await {
            Ok(written) => {
                *staged = written;
                return Ok(attempt);
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < attempts => {
                let fresh = api.get(&name).await?;
                staged.metadata.resource_version = fresh.metadata.resource_version;
            }
            Err(e) => return Err(e),
        }
    }
}
