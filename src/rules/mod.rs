//! Where the ownership rules come from ([`source`]) and, in the server, which
//! rules are in force (`store`).
//!
//! Every source — the embedded example, a file holding the document or a
//! ConfigMap manifest, a live ConfigMap — goes through [`source::RulesSource::load`]
//! or [`source::from_configmap`], which end in the one parser
//! [`source::parse_document`]: `serve`, `check`, `review` and the library
//! read a source the same way.
//!
//! In cluster mode, writes of the ConfigMap are also checked at the door
//! (`admission`).

#[cfg(feature = "server")]
pub(crate) mod admission;
pub mod source;
#[cfg(feature = "server")]
pub(crate) mod store;

pub use source::{ConfigMapRef, EMBEDDED_OWNERSHIP, LoadError, RulesSource, parse_document};
#[cfg(feature = "client")]
pub use source::{fetch_configmap, from_configmap};
