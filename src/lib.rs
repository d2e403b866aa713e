//! statusguard: ownership of shared Kubernetes status fields.
//!
//! - [`ownership`]: the ownership document, shared by the webhook and the library.
//! - [`decision`]: the pure admission decision (deny, trim, or report).
//! - [`review`]: AdmissionReview on the wire.
//! - with the `server` feature: [`server`] (the webhook), [`tls`], [`metrics`], [`cli`].
#![forbid(unsafe_code)]
// Input comes from outside: nothing in the library may panic on it.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod decision;
pub mod ownership;
pub mod review;

#[cfg(feature = "client")]
pub mod configmap;
#[cfg(feature = "client")]
pub mod flush;

#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod tls;
