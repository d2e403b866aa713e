//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod chart;
pub mod cluster;
pub mod gateway;
pub mod legacy;
pub mod mtls;
pub mod scenario;
pub mod wait;
pub mod webhook;
