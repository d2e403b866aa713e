//! What the server keeps in step with the cluster, each a thin loop beside
//! a pure decision: the ownership ConfigMap (`config_watch`), the webhook
//! configurations (`registration`) with the CRDs' storage versions they
//! name (`versions`), the certificates it keeps for itself ([`certs`]),
//! the observer of status writes (`observer`) and the one recorder of
//! every Event (`events`).
//!
//! Data flows one way: the live document reaches the rules store and the
//! registration switch; the registration loop follows both through typed
//! channels.

/// The field manager of every server-side apply the servers make (their
/// webhook configurations, the kept document): one manager, so that every
/// replica writes the same fields and they converge without a leader.
pub(crate) const FIELD_MANAGER: &str = "statusguard";

pub mod certs;
pub(crate) mod config_watch;
pub(crate) mod events;
pub(crate) mod kept_document;
pub(crate) mod observer;
pub(crate) mod registration;
pub(crate) mod versions;
