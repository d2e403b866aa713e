//! The server's certificates: what they should be ([`policy`], pure, and the
//! one home of rcgen and PEM parsing), kept in a Secret its replicas share
//! (`secret`), or read from files that are polled for a change ([`files`]).
//! Each source feeds [`tls::SwappableCert`], which the TLS port serves from
//! ([`tls`]: the rustls configuration and the client verifier).

pub mod files;
pub mod policy;
pub(crate) mod secret;
pub mod tls;
