//! Creating and deleting the run's temporary streams.

use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;

use crate::wire;

/// Creates the streams with this content type (a PUT in both protocols).
pub(crate) async fn create_streams(
    client: &reqwest::Client,
    base: &str,
    names: &[String],
    content_type: &str,
) -> Result<(), String> {
    for (i, name) in names.iter().enumerate() {
        let what = format!("create {name}");
        let resp = client
            .put(format!("{base}{name}"))
            .header(CONTENT_TYPE, content_type)
            .send()
            .await
            .map_err(|e| format!("{what}: {}", wire::describe(&e)));
        let outcome = match resp {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(resp) => Err(wire::status_error(&what, resp).await),
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            delete_streams(client, base, &names[..i]).await;
            return Err(e);
        }
    }
    Ok(())
}

/// Deletes the streams; failures are reported on stderr but do not fail the run.
pub(crate) async fn delete_streams(client: &reqwest::Client, base: &str, names: &[String]) {
    for name in names {
        match client.delete(format!("{base}{name}")).send().await {
            Ok(resp) if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND => {}
            Ok(resp) => {
                eprintln!(
                    "warning: {}",
                    wire::status_error(&format!("delete {name}"), resp).await
                )
            }
            Err(e) => eprintln!("warning: delete {name}: {}", wire::describe(&e)),
        }
    }
}
