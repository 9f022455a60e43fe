//! Connecting to the planner's `redrive.v1.Planner` service.

use std::{error::Error as _, time::Duration};

use redrive_proto::v1::planner_client::PlannerClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::CliError;

/// Where the planner listens by default (its own `--listen` default).
pub const DEFAULT_PLANNER: &str = "http://127.0.0.1:50051";

/// Largest answer accepted: a dead letter with a 16 MiB body and its
/// revisions, base64 aside, fits well.
pub const MAX_DECODING_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long to try to open the connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A planner client.
pub type Planner = PlannerClient<Channel>;

/// Checks a `--planner` value: an `http://` or `https://` URL.
///
/// # Errors
/// A message saying what is wrong, for clap.
pub fn parse_planner_url(url: &str) -> Result<String, String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("expected an http:// or https:// URL, e.g. http://127.0.0.1:50051".to_owned());
    }
    Endpoint::from_shared(url.to_owned()).map_err(|error| format!("not a valid URL: {error}"))?;
    Ok(url.to_owned())
}

/// Connects to the planner at `url`, eagerly, so an unreachable planner is
/// reported once, clearly, before any work is done.
///
/// # Errors
/// [`CliError::Unreachable`] with the transport's reason.
pub async fn connect(url: &str) -> Result<Planner, CliError> {
    let unreachable = |cause: String| CliError::Unreachable {
        url: url.to_owned(),
        cause,
    };
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|error| unreachable(error.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| unreachable(error_chain(&error)))?;
    Ok(PlannerClient::new(channel).max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES))
}

/// `error` and its sources joined with `: `, repeated texts left out
/// (`transport error: tcp connect error: Connection refused (os error 111)`).
fn error_chain(error: &tonic::transport::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_urls_need_a_scheme() {
        assert!(parse_planner_url(DEFAULT_PLANNER).is_ok());
        assert!(parse_planner_url("https://planner.internal:443").is_ok());
        assert!(parse_planner_url("127.0.0.1:50051").is_err());
        assert!(parse_planner_url("http://bad host").is_err());
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        // Bind then drop: the port is free, so the connection is refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let error = connect(&url).await.unwrap_err();
        assert_eq!(error.exit_code(), crate::error::EX_UNAVAILABLE);
        assert!(error.to_string().contains(&url), "{error}");
    }
}
