//! The API's admin token: from an SSM SecureString parameter, a variable, or (outside Lambda)
//! generated once and kept in the control table.

use super::{parameters::ParameterError, settings::AwsSettings, shape::AwsShape};

const ADMIN_TOKEN_SETTING: &str = "admin_token";

#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    #[error(
        "no admin token configured: set HOOKLANE_ADMIN_TOKEN_PARAMETER to the SSM parameter \
         that holds it"
    )]
    NotConfigured,
    #[error("cannot read the admin token from SSM parameter {parameter}: {message}")]
    Parameter { parameter: String, message: String },
    #[error("the admin token in SSM parameter {0} is empty")]
    EmptyParameter(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The API's admin token, read once when the function starts: from the SSM parameter
/// `HOOKLANE_ADMIN_TOKEN_PARAMETER` (decrypted), else `HOOKLANE_ADMIN_TOKEN`. Outside Lambda
/// (local runs against an emulator) a token can also be generated on first use and kept in
/// the control table; a deployed function refuses to start without a configured one.
pub async fn admin_token(
    shape: &AwsShape,
    settings: &AwsSettings,
) -> Result<String, AdminTokenError> {
    if let Some(parameter) = &settings.admin_token_parameter {
        return admin_token_from_parameter(&shape.ssm, parameter).await;
    }
    if let Some(token) = &settings.admin_token {
        return Ok(token.clone());
    }
    if settings.in_lambda {
        return Err(AdminTokenError::NotConfigured);
    }
    let generated = format!("hl_admin_{}", uuid::Uuid::new_v4().simple());
    Ok(shape
        .app
        .store
        .put_setting_if_absent(ADMIN_TOKEN_SETTING, &generated)
        .await?)
}

async fn admin_token_from_parameter(
    ssm: &aws_sdk_ssm::Client,
    parameter: &str,
) -> Result<String, AdminTokenError> {
    super::parameters::secure_string(ssm, parameter)
        .await
        .map_err(|e| match e {
            ParameterError::Empty(parameter) => AdminTokenError::EmptyParameter(parameter),
            ParameterError::Unreadable { parameter, message }
            | ParameterError::Invalid { parameter, message } => {
                AdminTokenError::Parameter { parameter, message }
            }
        })
}
