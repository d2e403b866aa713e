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

pub mod certs;
pub(crate) mod config_watch;
pub(crate) mod events;
pub(crate) mod observer;
pub(crate) mod registration;
pub(crate) mod versions;
