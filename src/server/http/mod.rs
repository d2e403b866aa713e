//! The two ports: the TLS accept loop ([`accept`]) in front of the webhook
//! endpoints ([`admission`]), and the plain-HTTP admin port ([`admin`]:
//! probes, metrics, the record of observed writes).

pub mod accept;
pub mod admin;
pub mod admission;
