//! `hooklane verify`: checks a received webhook the way a customer's code should.

use hooklane::signing::{self, SigningSecret, VerifyError};

#[derive(Debug, thiserror::Error)]
pub enum VerifyFailure {
    #[error("invalid secret: {0}")]
    Secret(#[from] signing::SecretError),
    #[error("invalid: {0}")]
    Signature(#[from] VerifyError),
}

/// Verifies `body` against every given secret (two during a rotation).
pub fn verify(
    secrets: &[String],
    msg_id: &str,
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyFailure> {
    let secrets = secrets
        .iter()
        .map(|s| SigningSecret::parse(s.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&SigningSecret> = secrets.iter().collect();
    signing::verify(
        &refs,
        msg_id,
        timestamp,
        signature,
        body,
        now_unix,
        tolerance_secs,
    )?;
    Ok(())
}
