//! The CRD check: owned paths a structural schema would prune.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrBool,
};

use super::{FlushError, StatusWriter};

impl<K> StatusWriter<K> {
    /// Owned field paths, the conditions path and owned keyed lists that
    /// the CRD's structural schema for `version` would prune: each must be
    /// declared under `status` in `openAPIV3Schema`, unless a parent
    /// preserves unknown fields.
    pub fn check_schema(&self, crd: &CustomResourceDefinition, version: &str) -> Result<(), FlushError> {
        let status = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .and_then(|p| p.get("status"))
            .ok_or_else(|| FlushError::NoSchema(version.to_owned()))?;
        let unknown: Vec<String> = self
            .owned
            .fields
            .iter()
            .chain(std::iter::once(&self.conditions_path))
            .chain(self.owned.entries.iter().map(|(list, _)| &list.path))
            .filter(|p| !schema_has(status, p.segments()))
            .map(ToString::to_string)
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(FlushError::UnknownFields(unknown))
        }
    }
}

/// Whether the structural schema below `.status` declares `segments`.
fn schema_has(schema: &JSONSchemaProps, segments: &[String]) -> bool {
    let Some((first, rest)) = segments.split_first() else {
        return true;
    };
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
        return true;
    }
    match schema.properties.as_ref().and_then(|p| p.get(first)) {
        Some(child) => schema_has(child, rest),
        None => matches!(
            &schema.additional_properties,
            Some(JSONSchemaPropsOrBool::Schema(s)) if schema_has(s, rest)
        ),
    }
}
