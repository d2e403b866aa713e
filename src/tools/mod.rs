//! The commands that look at a cluster from outside the server: `probe`
//! calls the registered webhooks as the API server does, `suggest` drafts
//! an ownership document from who writes what today. `http1` is the one
//! HTTP client both use.

pub(crate) mod http1;
pub(crate) mod probe;
pub(crate) mod suggest;
