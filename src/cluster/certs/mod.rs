//! The server's certificates: what they should be ([`policy`], pure, and the
//! one home of rcgen and PEM parsing), kept in a Secret its replicas share
//! ([`secret`]), or read from files that are polled for a change ([`files`]).
//! Each source feeds [`crate::server::tls::SwappableCert`].

pub mod files;
pub mod policy;
pub mod secret;
