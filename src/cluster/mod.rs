//! What the server keeps in step with the cluster it runs in.

pub mod certs;
