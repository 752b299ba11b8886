//! The fan-out function's trigger, locally: the events table's stream read shard by shard.

use super::*;

/// The fan-out function's trigger: reads the events table's stream shard by shard. Like
/// Lambda's event source mapping, it keeps where it got to in each shard (in the control
/// table, `stream#{shard}`), so a restarted runner goes on from there instead of fanning
/// out the whole stream again.
pub(super) struct StreamPoller {
    pub(super) shape: AwsShape,
    pub(super) dynamodb: aws_sdk_dynamodb::Client,
    pub(super) streams: aws_sdk_dynamodbstreams::Client,
    pub(super) table: String,
    /// The control table, where the checkpoints are kept.
    pub(super) checkpoints: String,
}

/// Where to (re)start reading a shard.
#[derive(Debug, Clone)]
pub(super) enum ShardStart {
    Beginning,
    After(String),
    At(String),
}

pub(super) struct ShardCursor {
    iterator: Option<String>,
    start: ShardStart,
    retries: Retries,
}

/// Lambda's rule for a record whose fan-out keeps failing: tried once and retried
/// [`STREAM_RETRIES`] times, then given up, so that one record does not hold its shard
/// back for the 24 hours the stream keeps it.
#[derive(Debug, Default)]
pub(super) struct Retries {
    record: Option<String>,
    failures: u32,
}

impl Retries {
    /// Counts a failure of the record at `sequence`; whether it is now given up.
    pub(super) fn give_up(&mut self, sequence: &str) -> bool {
        if self.record.as_deref() == Some(sequence) {
            self.failures += 1;
        } else {
            self.record = Some(sequence.to_owned());
            self.failures = 1;
        }
        let given_up = self.failures > crate::aws::stream::STREAM_RETRIES;
        if given_up {
            *self = Self::default();
        }
        given_up
    }
}

impl StreamPoller {
    pub(super) async fn stream_arn(&self) -> Result<String, String> {
        let described = as_function(
            RUNNER,
            self.dynamodb
                .describe_table()
                .table_name(&self.table)
                .send(),
        )
        .await
        .map_err(|e| error_text(&e))?;
        described
            .table()
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_owned)
            .ok_or_else(|| format!("table {} has no stream", self.table))
    }

    /// Adds the shards not seen yet; a child shard waits until its parent is read to the end.
    pub(super) async fn discover(
        &self,
        arn: &str,
        cursors: &mut HashMap<String, ShardCursor>,
        finished: &HashSet<String>,
    ) -> Result<(), String> {
        let mut after: Option<String> = None;
        loop {
            let described = self
                .streams
                .describe_stream()
                .stream_arn(arn)
                .set_exclusive_start_shard_id(after.clone())
                .send()
                .await
                .map_err(|e| error_text(&e))?;
            let Some(description) = described.stream_description() else {
                return Ok(());
            };
            for shard in description.shards() {
                let Some(id) = shard.shard_id() else { continue };
                if cursors.contains_key(id) || finished.contains(id) {
                    continue;
                }
                let parent_unread = shard
                    .parent_shard_id()
                    .is_some_and(|parent| cursors.contains_key(parent));
                if !parent_unread {
                    let start = match self.checkpoint(id).await {
                        Some(sequence) => ShardStart::After(sequence),
                        None => ShardStart::Beginning,
                    };
                    cursors.insert(
                        id.to_owned(),
                        ShardCursor {
                            iterator: None,
                            start,
                            retries: Retries::default(),
                        },
                    );
                }
            }
            match description.last_evaluated_shard_id() {
                Some(last) => after = Some(last.to_owned()),
                None => return Ok(()),
            }
        }
    }

    /// The last sequence number of `shard` a previous run fanned out, if any.
    pub(super) async fn checkpoint(&self, shard: &str) -> Option<String> {
        let read = as_function(
            RUNNER,
            self.dynamodb
                .get_item()
                .table_name(&self.checkpoints)
                .key(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!("stream#{shard}")),
                )
                .consistent_read(true)
                .send(),
        )
        .await;
        match read {
            Ok(out) => match out.item.as_ref().and_then(|item| item.get("after")) {
                Some(aws_sdk_dynamodb::types::AttributeValue::S(sequence)) => {
                    Some(sequence.clone())
                }
                _ => None,
            },
            Err(e) => {
                // Reading from the start again is harmless (fan-out is idempotent), only slower.
                tracing::warn!(shard, error = %error_text(&e), "cannot read the stream checkpoint; reading the shard from its start");
                None
            }
        }
    }

    pub(super) async fn save_checkpoint(&self, shard: &str, sequence: &str) {
        let written = as_function(
            RUNNER,
            self.dynamodb
                .put_item()
                .table_name(&self.checkpoints)
                .item(
                    "pk",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!("stream#{shard}")),
                )
                .item(
                    "after",
                    aws_sdk_dynamodb::types::AttributeValue::S(sequence.to_owned()),
                )
                .send(),
        )
        .await;
        if let Err(e) = written {
            tracing::warn!(shard, error = %error_text(&e), "cannot save the stream checkpoint; a restart reads these records again");
        }
    }

    pub(super) async fn iterator(
        &self,
        arn: &str,
        shard: &str,
        start: &ShardStart,
    ) -> Result<String, String> {
        let request = self
            .streams
            .get_shard_iterator()
            .stream_arn(arn)
            .shard_id(shard);
        let request = match start {
            ShardStart::Beginning => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            ShardStart::After(sequence) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(sequence),
            ShardStart::At(sequence) => request
                .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(sequence),
        };
        request
            .send()
            .await
            .map_err(|e| error_text(&e))?
            .shard_iterator
            .ok_or_else(|| format!("no iterator for shard {shard}"))
    }

    /// Reads one batch of a shard and fans out its records in order. Returns how many
    /// records it took, and whether the shard has ended. After an error the cursor is left
    /// where the next read must start (the failed record, as Lambda retries it).
    pub(super) async fn read(
        &self,
        arn: &str,
        shard: &str,
        cursor: &mut ShardCursor,
    ) -> Result<(usize, bool), String> {
        let iterator = match cursor.iterator.take() {
            Some(iterator) => iterator,
            None => self.iterator(arn, shard, &cursor.start).await?,
        };
        let batch = match self
            .streams
            .get_records()
            .shard_iterator(iterator)
            .limit(100)
            .send()
            .await
        {
            Ok(batch) => batch,
            // An iterator lives 15 minutes; the next read asks for a new one.
            Err(e) => return Err(error_text(&e)),
        };
        let mut images = Vec::new();
        let mut sequences = Vec::new();
        let mut last = None;
        for record in batch.records() {
            let Some(change) = record.dynamodb() else {
                continue;
            };
            let sequence = change.sequence_number().unwrap_or_default().to_owned();
            if record.event_name() == Some(&OperationType::Insert) {
                images.push(change.new_image().map(image_json).unwrap_or(Value::Null));
                sequences.push(sequence.clone());
            }
            last = Some(sequence);
        }
        if let Err((position, error)) = handlers::fan_out_images(&self.shape, &images).await {
            let sequence = sequences.get(position).cloned().unwrap_or_default();
            if !cursor.retries.give_up(&sequence) {
                let failed = format!("fan-out of record {sequence} failed: {error}");
                cursor.start = ShardStart::At(sequence);
                return Err(failed);
            }
            // Given up as Lambda does (which also sends the shard and sequence to the
            // failure queue): the records after it are read next, and the sweeper fans the
            // event out once its grace has passed.
            tracing::error!(
                shard,
                sequence = %sequence,
                retries = crate::aws::stream::STREAM_RETRIES,
                %error,
                "stream record given up after its retries; the sweeper recovers its event"
            );
            self.save_checkpoint(shard, &sequence).await;
            cursor.start = ShardStart::After(sequence);
            return Ok((position + 1, false));
        }
        cursor.retries = Retries::default();
        let taken = batch.records().len();
        if let Some(sequence) = last {
            self.save_checkpoint(shard, &sequence).await;
            cursor.start = ShardStart::After(sequence);
        }
        match batch.next_shard_iterator {
            Some(next) => {
                cursor.iterator = Some(next);
                Ok((taken, false))
            }
            None => Ok((taken, true)),
        }
    }

    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let arn = loop {
            match self.stream_arn().await {
                Ok(arn) => break arn,
                Err(error) => {
                    tracing::warn!(%error, "cannot find the events stream; retrying");
                    if !pause(ERROR_BACKOFF, &mut stop).await {
                        return;
                    }
                }
            }
        };
        let mut cursors: HashMap<String, ShardCursor> = HashMap::new();
        let mut finished: HashSet<String> = HashSet::new();
        let mut refreshed: Option<tokio::time::Instant> = None;
        loop {
            if refreshed.is_none_or(|at| at.elapsed() >= SHARD_REFRESH) {
                match self.discover(&arn, &mut cursors, &finished).await {
                    Ok(()) => refreshed = Some(tokio::time::Instant::now()),
                    Err(error) => tracing::warn!(%error, "cannot list the stream's shards"),
                }
            }
            let mut busy = false;
            let mut failed = false;
            let shards: Vec<String> = cursors.keys().cloned().collect();
            for shard in shards {
                let Some(cursor) = cursors.get_mut(&shard) else {
                    continue;
                };
                match self.read(&arn, &shard, cursor).await {
                    Ok((taken, ended)) => {
                        busy |= taken > 0;
                        if ended {
                            cursors.remove(&shard);
                            finished.insert(shard);
                            refreshed = None;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(shard = %shard, %error, "stream not read to the end; retrying from where it stopped");
                        failed = true;
                    }
                }
            }
            let wait = if failed {
                ERROR_BACKOFF
            } else if busy {
                Duration::ZERO
            } else {
                IDLE_POLL
            };
            if !pause(wait, &mut stop).await {
                return;
            }
        }
    }
}

/// A stream image in the DynamoDB JSON the Lambda event carries (`{"S": ...}` and so on).
pub fn image_json(image: &HashMap<String, AttributeValue>) -> Value {
    Value::Object(
        image
            .iter()
            .map(|(name, value)| (name.clone(), attribute_json(value)))
            .collect::<Map<_, _>>(),
    )
}

pub(super) fn attribute_json(value: &AttributeValue) -> Value {
    let typed = |kind: &str, inner: Value| {
        let mut object = Map::new();
        object.insert(kind.to_owned(), inner);
        Value::Object(object)
    };
    let strings =
        |items: &[String]| Value::Array(items.iter().cloned().map(Value::String).collect());
    match value {
        AttributeValue::S(s) => typed("S", Value::String(s.clone())),
        AttributeValue::N(n) => typed("N", Value::String(n.clone())),
        AttributeValue::Bool(b) => typed("BOOL", Value::Bool(*b)),
        AttributeValue::Null(n) => typed("NULL", Value::Bool(*n)),
        AttributeValue::B(blob) => typed("B", Value::String(STANDARD.encode(blob.as_ref()))),
        AttributeValue::Ss(items) => typed("SS", strings(items)),
        AttributeValue::Ns(items) => typed("NS", strings(items)),
        AttributeValue::Bs(items) => typed(
            "BS",
            Value::Array(
                items
                    .iter()
                    .map(|b| Value::String(STANDARD.encode(b.as_ref())))
                    .collect(),
            ),
        ),
        AttributeValue::L(items) => typed(
            "L",
            Value::Array(items.iter().map(attribute_json).collect()),
        ),
        AttributeValue::M(map) => typed("M", image_json(map)),
        // A type newer than this SDK: nothing here reads it.
        _ => Value::Null,
    }
}
