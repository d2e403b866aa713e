//! statusguard: ownership of shared Kubernetes status fields.
//!
//! When several controllers share the status of one resource, a stale full
//! update rolls another controller's fields back. statusguard ends that from
//! both sides: an admission webhook that denies, trims or reports writes to
//! what another writer owns, and, for kube-rs controllers,
//! [`flush::StatusWriter`], which sends only what the controller owns.
//!
//! Library users who want only the flush and the ownership rules depend on
//! `statusguard = { version = "...", default-features = false, features = ["client"] }`
//! and choose their own k8s-openapi version feature; the server's
//! dependencies (axum, TLS serving, metrics) come only with `server`.
//!
//! ```
//! use statusguard::ownership::Ownership;
//!
//! let rules = Ownership::from_yaml(r#"
//! apiVersion: statusguard.dev/v1alpha1
//! kind: StatusOwnership
//! resources:
//!   - group: example.com
//!     resource: widgets
//!     writers:
//!       - {serviceAccount: platform/widget-controller, fields: [observedGeneration], conditions: [Ready]}
//! "#).unwrap();
//! let widgets = rules.resource("example.com", "widgets").unwrap();
//! let controller = widgets.writer("system:serviceaccount:platform:widget-controller").unwrap();
//! assert_eq!(controller.fields[0].to_string(), "observedGeneration");
//! ```
//!
//! The public surface, and what is safe to depend on:
//! - [`ownership`]: the ownership document, shared by the webhook and the library.
//! - [`rules`]: where the document comes from (file, embedded, ConfigMap), one loader for all.
//! - [`admission`]: an AdmissionReview read, decided (deny, trim, or report) and answered,
//!   as the server does it; [`admission::answer::answer`] for offline decisions.
//! - with the `client` feature: [`flush`], the status flush for controllers.
//! - with the `server` feature: [`server`] (the webhook), [`cluster`] (what it keeps in
//!   step with the cluster; of it only the certificates are public), [`metrics`], [`cli`];
//!   these serve the binary and may change with it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Input comes from outside: nothing in the library may panic on it.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod admission;
pub mod ownership;
pub mod rules;
mod value_budget;

#[cfg(test)]
mod test_support;

#[cfg(feature = "client")]
pub mod flush;

#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod policies;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub(crate) mod tools;
