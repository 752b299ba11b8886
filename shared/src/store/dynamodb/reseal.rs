//! Re-sealing endpoint secrets under the current key after a key rotation: every write of an
//! endpoint seals under it already; this moves the endpoints nobody writes.

use super::*;

/// What [`DynamoStore::reseal_secrets`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResealReport {
    /// Endpoints whose items were read.
    pub examined: usize,
    /// Endpoints whose secrets were sealed again under the current key.
    pub resealed: usize,
    /// Endpoints written by someone else between the read and the write: left alone (a
    /// write seals under the key of the writer; run again to check).
    pub changed_meanwhile: usize,
}

impl DynamoStore {
    /// Opens every endpoint secret of the endpoints table and seals again, under the current
    /// key, those that are plaintext or sealed under another key
    /// (`HOOKLANE_SECRETS_KEY_PREVIOUS`). Each item is rewritten only if its secrets are still
    /// what was read. A secret that does not open stops the walk with an error naming its
    /// endpoint; what was re-sealed before stays so.
    pub async fn reseal_secrets(&self) -> StoreResult<ResealReport> {
        let SecretsAccess::Keys(cipher) = &self.secrets else {
            return Err(StoreError::Backend(SecretsError::Withheld.to_string()));
        };
        let mut report = ResealReport::default();
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&self.tables.endpoints)
                .projection_expression("account_id, id, secret, retiring_secret, headers, #deleted")
                .expression_attribute_names("#deleted", DELETED_AT)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(sdk)?;
            for item in out.items.unwrap_or_default() {
                if is_tombstone(&item) {
                    continue;
                }
                report.examined += 1;
                let account = AccountId::from_trusted(get_s(&item, "account_id")?);
                let id = EndpointId::from_trusted(get_s(&item, "id")?);
                let secret = get_s(&item, "secret")?;
                let retiring = opt_s(&item, "retiring_secret");
                let headers = opt_s(&item, "headers");
                let corrupt = |e: SecretsError| {
                    StoreError::Corrupt(format!("endpoint {id} of account {account}: {e}"))
                };
                // Every value is opened, re-sealed or not: the walk checks that the keys
                // configured open every secret of the table.
                let resealed = cipher
                    .reseal((&secret, retiring.as_deref()), &account, &id)
                    .map_err(corrupt)?;
                let new_headers = headers
                    .as_deref()
                    .map(|h| cipher.reseal_headers(h, &account, &id))
                    .transpose()
                    .map_err(corrupt)?
                    .flatten();
                if resealed.is_none() && new_headers.is_none() {
                    continue;
                }
                let (new_secret, new_retiring) =
                    resealed.unwrap_or_else(|| (secret.clone(), retiring.clone()));
                let mut update = self
                    .client
                    .update_item()
                    .table_name(&self.tables.endpoints)
                    .key("account_id", s(account.as_str()))
                    .key("id", s(id.as_str()))
                    .expression_attribute_names("#deleted", DELETED_AT)
                    .expression_attribute_values(":old", s(secret.as_str()))
                    .expression_attribute_values(":new", s(new_secret));
                // Written only if what was read is still there.
                let mut set = vec!["secret = :new"];
                let mut condition = vec!["secret = :old", "attribute_not_exists(#deleted)"];
                match (&retiring, new_retiring) {
                    (Some(old_retiring), Some(new_retiring)) => {
                        set.push("retiring_secret = :new_r");
                        condition.push("retiring_secret = :old_r");
                        update = update
                            .expression_attribute_values(":old_r", s(old_retiring.as_str()))
                            .expression_attribute_values(":new_r", s(new_retiring));
                    }
                    _ => condition.push("attribute_not_exists(retiring_secret)"),
                }
                if let (Some(old_headers), Some(new_headers)) = (&headers, new_headers) {
                    set.push("headers = :new_h");
                    condition.push("headers = :old_h");
                    update = update
                        .expression_attribute_values(":old_h", s(old_headers.as_str()))
                        .expression_attribute_values(":new_h", s(new_headers));
                }
                let update = update
                    .update_expression(format!("SET {}", set.join(", ")))
                    .condition_expression(condition.join(" AND "));
                match written(update.send().await)? {
                    Some(_) => report.resealed += 1,
                    None => report.changed_meanwhile += 1,
                }
            }
            match out.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        Ok(report)
    }
}
