//! `statusguard unregister`: stand every server down, then delete both
//! webhook configurations, and the admission policies of the same set
//! name, until they stay gone.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};

use super::Switch;
use crate::cluster::kept_document::state_configmap;
use crate::rules::ConfigMapRef;

/// What `unregister` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unregistered {
    /// The configurations deleted, by kind.
    pub deleted: Vec<String>,
    /// The ConfigMap annotated to stand the servers down, if one was named.
    pub stood_down: Option<String>,
}

/// Stands every running server down (the ConfigMap's
/// [`REGISTRATION_ANNOTATION`](super::REGISTRATION_ANNOTATION) set to
/// `disabled`, when `configmap` is given; on its state ConfigMap when it
/// is gone), then deletes both
/// configurations, and keeps deleting them until they have stayed gone for
/// `settle` (a server that applied just before it saw the annotation cannot
/// bring them back).
pub async fn unregister(
    client: &Client,
    name: &str,
    configmap: Option<&ConfigMapRef>,
    settle: Duration,
) -> Result<Unregistered, kube::Error> {
    let mut done = Unregistered::default();
    if let Some(configmap) = configmap {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &configmap.namespace);
        let patch = Switch::stand_down_patch();
        match api
            .patch(&configmap.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => done.stood_down = Some(configmap.to_string()),
            // No ConfigMap: the servers may still enforce (and register)
            // the document kept for restarts, so the switch goes on the
            // state ConfigMap, made if it is gone too; else the deletions
            // below would be undone for ever. It stays there until an
            // operator removes it.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let state = state_configmap(configmap);
                let mut apply = Switch::stand_down_patch();
                apply["apiVersion"] = "v1".into();
                apply["kind"] = "ConfigMap".into();
                apply["metadata"]["name"] = state.name.clone().into();
                let params = PatchParams::apply("statusguard-unregister").force();
                api.patch(&state.name, &params, &Patch::Apply(&apply)).await?;
                done.stood_down = Some(state.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let mut deleted_now = false;
        for (kind, deleted) in [
            (
                "ValidatingWebhookConfiguration",
                delete_if_present(&validating, name).await?,
            ),
            (
                "MutatingWebhookConfiguration",
                delete_if_present(&mutating, name).await?,
            ),
        ] {
            if deleted {
                deleted_now = true;
                let entry = format!("{kind} {name}");
                if !done.deleted.contains(&entry) {
                    done.deleted.push(entry);
                }
            }
        }
        // The admission policies of the set of this name (--register-policies).
        // A caller that may not even list them (the webhook engine's RBAC)
        // has none to delete.
        for kind in crate::policies::KINDS.iter().rev() {
            let members = match super::policies::set_members(client, name, kind)
                .await
                .map_err(into_kube)
            {
                Ok(members) => members,
                Err(kube::Error::Api(e)) if e.code == 403 => continue,
                Err(e) => return Err(e),
            };
            for member in members {
                if super::policies::delete(client, kind, &member)
                    .await
                    .map_err(into_kube)?
                {
                    deleted_now = true;
                    let entry = format!("{kind} {member}");
                    if !done.deleted.contains(&entry) {
                        done.deleted.push(entry);
                    }
                }
            }
        }
        if deleted_now {
            quiet_since = tokio::time::Instant::now();
        }
        if quiet_since.elapsed() >= settle {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(250).min(settle)).await;
    }
}

fn into_kube(error: super::policies::PolicyRegistrationError) -> kube::Error {
    let super::policies::PolicyRegistrationError::Write { source, .. } = error;
    source
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}
