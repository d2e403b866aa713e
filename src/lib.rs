//! statusguard: ownership of shared Kubernetes status fields.
//!
//! - [`ownership`]: the ownership document, shared by the webhook and the library.
//! - [`decision`]: the pure admission decision (deny, trim, or report).
//! - [`review`]: AdmissionReview on the wire.
#![forbid(unsafe_code)]

pub mod decision;
pub mod ownership;
pub mod review;
