//! Two controllers share one Widget's status: a "controller" that owns
//! `observedGeneration` and writes it with statusguard's `StatusWriter`,
//! and a "scaler" that owns `replicas` and, with `--scaler legacy`, writes
//! from a stale copy with a full Update and the naive conflict retry (the
//! write `StatusWriter` never sends; it is spelled out below to show why).
//!
//! Runs against any cluster that has the Widget CRD (tests/cluster/widget-crd.yaml):
//!
//!     kubectl apply -f tests/cluster/widget-crd.yaml
//!     cargo run --example shared_status -- --scaler legacy    # observedGeneration is rolled back
//!     cargo run --example shared_status -- --scaler library   # both writes are kept
//!
//! It uses the current kubeconfig context (or in-cluster config) and the
//! namespace given with `--namespace` (default `default`).

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use statusguard::flush::StatusWriter;

/// The classic retry: a full Update of the stale copy, and on 409 a refresh
/// of only the resourceVersion before sending the same stale status again.
async fn legacy_flush(api: &Api<DynamicObject>, stale: &mut DynamicObject) -> Result<u32, kube::Error> {
    let name = stale.metadata.name.clone().unwrap_or_default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        match api.replace_status(&name, &PostParams::default(), &*stale).await {
            Ok(_) => return Ok(attempt),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => {
                stale.metadata.resource_version = api.get(&name).await?.metadata.resource_version;
            }
            Err(e) => return Err(e),
        }
    }
}

const NAME: &str = "shared-status-demo";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    };
    let namespace = flag("--namespace", "default");
    let scaler_mode = flag("--scaler", "legacy");

    let client = kube::Client::try_default().await?;
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &namespace, &ApiResource::from_gvk_with_plural(&gvk, "widgets"));

    // A fresh Widget with a status both controllers write.
    if api.get_opt(NAME).await?.is_some() {
        api.delete(NAME, &Default::default()).await?;
        while api.get_opt(NAME).await?.is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": NAME}, "spec": {"size": 1}
    }))?;
    let mut created = api.create(&PostParams::default(), &object).await?;
    created.data["status"] = json!({"observedGeneration": 1, "replicas": 1});
    api.replace_status(NAME, &PostParams::default(), &created).await?;

    // The scaler reads the Widget...
    let mut scaler_copy = api.get(NAME).await?;

    // ...the controller then writes a newer observedGeneration, with the library.
    let controller = StatusWriter::new(api.clone())
        .owned_fields(["observedGeneration"])?
        .owned_conditions(["Ready"]);
    let mut controller_copy = api.get(NAME).await?;
    controller_copy.data["status"]["observedGeneration"] = json!(2);
    controller.flush(&mut controller_copy).await?;
    println!("controller: wrote observedGeneration 2");

    // ...and the scaler writes replicas from its stale copy.
    scaler_copy.data["status"]["replicas"] = json!(3);
    let attempts = match scaler_mode.as_str() {
        "library" => {
            let scaler = StatusWriter::new(api.clone())
                .owned_fields(["replicas"])?
                .owned_conditions(["Scaled"]);
            scaler.flush(&mut scaler_copy).await?.attempts
        }
        _ => legacy_flush(&api, &mut scaler_copy).await?,
    };
    println!("scaler ({scaler_mode}): wrote replicas 3 in {attempts} attempt(s)");

    let stored = api.get(NAME).await?;
    let status = &stored.data["status"];
    println!(
        "stored: observedGeneration {}, replicas {}",
        status["observedGeneration"], status["replicas"]
    );
    if status["observedGeneration"] == json!(2) {
        println!("both writes kept");
    } else {
        println!("the controller's observedGeneration was ROLLED BACK by the scaler's stale retry");
    }
    Ok(())
}
