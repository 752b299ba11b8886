//! SSM SecureString parameters, read (decrypted) once when a function starts: how a deployed
//! stack gets its admin token and the key of endpoint secrets without either being in the
//! stack's parameters or the functions' environment.

use crate::secrets::{parse_key, SecretsKeys};

#[derive(Debug, thiserror::Error)]
pub enum ParameterError {
    #[error("cannot read SSM parameter {parameter}: {message}")]
    Unreadable { parameter: String, message: String },
    #[error("SSM parameter {0} is empty")]
    Empty(String),
    #[error("SSM parameter {parameter}: {message}")]
    Invalid { parameter: String, message: String },
}

/// The parameter's value, decrypted and trimmed; an empty one is an error.
pub async fn secure_string(
    ssm: &aws_sdk_ssm::Client,
    parameter: &str,
) -> Result<String, ParameterError> {
    let response = ssm
        .get_parameter()
        .name(parameter)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| ParameterError::Unreadable {
            parameter: parameter.to_owned(),
            message: super::error_text(&e),
        })?;
    let value = response
        .parameter
        .and_then(|p| p.value)
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    if value.is_empty() {
        return Err(ParameterError::Empty(parameter.to_owned()));
    }
    Ok(value)
}

/// The key of endpoint secrets (and the one being rotated away from) from the parameters
/// named `current` and `previous` (`HOOKLANE_SECRETS_KEY_PARAMETER`,
/// `HOOKLANE_SECRETS_KEY_PREVIOUS_PARAMETER`), read with `ssm`, or the `configured` keys
/// (`HOOKLANE_SECRETS_KEY`, for local runs) when none is named.
pub async fn secrets_keys(
    ssm: &aws_sdk_ssm::Client,
    current: Option<&str>,
    previous: Option<&str>,
    configured: &SecretsKeys,
) -> Result<SecretsKeys, ParameterError> {
    let Some(current) = current else {
        return Ok(configured.clone());
    };
    let key = |parameter: &str| {
        let (ssm, parameter) = (&ssm, parameter.to_owned());
        async move {
            let raw = secure_string(ssm, &parameter).await?;
            parse_key(&raw, "HOOKLANE_SECRETS_KEY").map_err(|e| ParameterError::Invalid {
                parameter,
                message: e.message,
            })
        }
    };
    let previous = match previous {
        Some(parameter) => Some(key(parameter).await?),
        None => None,
    };
    Ok(SecretsKeys {
        current: Some(key(current).await?),
        previous,
    })
}
