//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod cluster;
pub mod scenario;
pub mod webhook;
