//! The webhook configurations statusguard keeps in step with the rules in
//! force: what they should be ([`desired`], pure), the loop that applies
//! them ([`keep`]), and their removal ([`unregister`]).
//!
//! The one switch that stands every replica down is here too: the
//! [`REGISTRATION_ANNOTATION`] on the ownership ConfigMap or on its state
//! ConfigMap ((`crate::cluster::kept_document`)), read by the ConfigMap watch into a
//! [`Switch`] and written by `statusguard unregister`.

pub(crate) mod desired;
pub(crate) mod keep;
pub mod policies;
pub(crate) mod unregister;

use k8s_openapi::api::core::v1::ConfigMap;

/// The annotation that stands every replica down: while it is `disabled`
/// on the ownership ConfigMap (set by `statusguard unregister`; the chart
/// renders it `enabled`) or on its state ConfigMap (the runbook under
/// GitOps, which renders only the first), no server applies its webhook
/// configurations.
pub const REGISTRATION_ANNOTATION: &str = "statusguard.dev/registration";
/// The annotation's value that stands the servers down.
const DISABLED: &str = "disabled";

/// Whether the servers may apply their webhook configurations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Switch {
    /// They keep them applied.
    #[default]
    Enabled,
    /// `statusguard unregister` stood them down: nothing is applied.
    StoodDown,
}

impl Switch {
    /// What a ConfigMap's annotation says.
    pub fn of(configmap: &ConfigMap) -> Self {
        let value = configmap
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REGISTRATION_ANNOTATION));
        match value.map(String::as_str) {
            Some(DISABLED) => Switch::StoodDown,
            _ => Switch::Enabled,
        }
    }

    /// The merge patch that stands the servers down.
    pub(crate) fn stand_down_patch() -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": {REGISTRATION_ANNOTATION: DISABLED}}})
    }
}
