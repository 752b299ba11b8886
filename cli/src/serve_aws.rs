//! `hooklane serve --backend aws`: the AWS shape's functions run locally (see
//! `hooklane::aws::local`), configured like the Lambda functions.

use std::collections::HashMap;

use hooklane::aws::{
    local::{self, LocalOptions, TokenSource},
    settings::AwsSettings,
};

/// Runs until Ctrl-C or SIGTERM. `provision` names a stack to create (or reuse) on the AWS
/// endpoint first, in place of the variables a SAM stack would set.
pub async fn run(mut vars: HashMap<String, String>, provision: Option<&str>) -> Result<(), String> {
    if let Some(prefix) = provision {
        let provisioned = local::provisioned_vars(prefix)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(prefix, "provisioned the tables, queue and schedule group");
        vars.extend(provisioned);
    }
    let settings =
        AwsSettings::from_vars(&vars).map_err(|e| format!("configuration error: {e}"))?;
    let options =
        LocalOptions::from_vars(&vars).map_err(|e| format!("configuration error: {e}"))?;
    // The functions' metrics (EMF on Lambda) as Prometheus text at /metrics, as `serve` has.
    let metrics = crate::serve::install_metrics().map_err(|e| e.to_string())?;
    let running = local::start(settings, options)
        .await
        .map_err(|e| e.to_string())?;
    let access = std::sync::Arc::clone(&running.access);
    let running = running.with_routes(crate::serve::metrics_route(metrics, access));
    match &running.token_source {
        TokenSource::Variable => println!("admin token: from HOOKLANE_ADMIN_TOKEN"),
        TokenSource::Parameter(name) => println!("admin token: from SSM parameter {name}"),
        TokenSource::ControlTable(table) => println!(
            "admin token (kept in DynamoDB table {table}, item pk=setting#admin_token; set HOOKLANE_ADMIN_TOKEN to choose your own): {}",
            running.admin_token
        ),
    }
    tracing::info!("hooklane serve --backend aws started");
    let shutdown = crate::serve::shutdown_signal();
    // Tests and scripts read this line to learn the port when listening on port 0.
    println!("hooklane listening on http://{}", running.local_addr);
    running.run_until(shutdown).await.map_err(|e| e.to_string())
}
