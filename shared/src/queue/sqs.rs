//! The AWS queue: SQS for delays up to 15 minutes, an EventBridge Scheduler one-time
//! schedule (which then sends the same message to the queue) for longer ones.
//!
//! Messages sent to SQS carry the account as `MessageGroupId`: on a standard queue that
//! makes it an SQS fair queue, so one account's backlog does not hold up another's fresh
//! work. Scheduler documents its `SqsParameters.MessageGroupId` for FIFO queues only, so a
//! schedule's message goes without one (the body names the account); these are retries
//! hours away, not the fresh work fairness is for.

use async_trait::async_trait;
use aws_sdk_scheduler::types::{
    ActionAfterCompletion, DeadLetterConfig, FlexibleTimeWindow, FlexibleTimeWindowMode, Target,
};
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::{Queue, QueueError};
use crate::{
    aws::{clients::answer_wait, error_text},
    clock::{to_millis, Clock, Timestamp},
    domain::{AccountId, DeliveryId, EndpointId},
    store::PendingRef,
};

/// SQS's longest message delay.
pub const MAX_SQS_DELAY_SECONDS: i64 = 900;
const SQS_BATCH: usize = 10;
/// Requests (batches of ten, or schedules) in flight at once: a fan-out of a stream batch to
/// a hundred endpoints each is a thousand batches, which one at a time took 30 s (a fan-out
/// past its function's timeout fails the stream batch, and its retry queues every message again).
const SEND_CONCURRENCY: usize = 16;

/// The body of every queue message: which delivery to attempt, and for whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub delivery_id: String,
    pub endpoint_id: String,
    pub account_id: String,
}

impl DeliveryMessage {
    pub fn from_ref(item: &PendingRef) -> Self {
        Self {
            delivery_id: item.delivery_id.to_string(),
            endpoint_id: item.endpoint_id.to_string(),
            account_id: item.account_id.to_string(),
        }
    }

    /// Parses a message body; ids are checked like any outside input.
    pub fn parse(body: &str) -> Result<(DeliveryId, EndpointId, AccountId), QueueError> {
        let message: Self = serde_json::from_str(body)
            .map_err(|e| QueueError(format!("not a delivery message: {e}")))?;
        let invalid = |e: crate::domain::InvalidField| QueueError(format!("bad message: {e}"));
        Ok((
            DeliveryId::parse(&message.delivery_id).map_err(invalid)?,
            EndpointId::parse(&message.endpoint_id).map_err(invalid)?,
            AccountId::parse(&message.account_id).map_err(invalid)?,
        ))
    }
}

/// Where long delays go: the Scheduler group and the role it assumes to send to the queue.
#[derive(Debug, Clone)]
pub struct SchedulerTarget {
    pub client: aws_sdk_scheduler::Client,
    pub group: String,
    pub role_arn: String,
    /// The queue Scheduler puts a schedule's event in when it cannot deliver it to the
    /// queue (the delivery itself stays pending and the sweeper sends it).
    pub dead_letter_arn: Option<String>,
}

#[derive(Clone)]
pub struct SqsQueue {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    queue_arn: String,
    scheduler: Option<SchedulerTarget>,
    clock: std::sync::Arc<dyn Clock>,
    /// Delays above this go to the Scheduler (when there is one).
    max_delay_ms: i64,
    /// How long each try of a send waits for SQS's answer.
    answer_wait: aws_smithy_types::timeout::TimeoutConfig,
}

impl SqsQueue {
    pub fn new(
        sqs: aws_sdk_sqs::Client,
        queue_url: impl Into<String>,
        queue_arn: impl Into<String>,
        scheduler: Option<SchedulerTarget>,
        clock: std::sync::Arc<dyn Clock>,
    ) -> Self {
        Self {
            sqs,
            queue_url: queue_url.into(),
            queue_arn: queue_arn.into(),
            scheduler,
            clock,
            max_delay_ms: MAX_SQS_DELAY_SECONDS * 1000,
            answer_wait: answer_wait(),
        }
    }

    /// Tries that wait 20 s for an answer: the emulator, sharing two cores with the whole
    /// suite, can take longer than SQS's 1.5 s, and a test not about that would fail.
    #[cfg(test)]
    pub(crate) fn with_patient_tries(mut self) -> Self {
        self.answer_wait = aws_smithy_types::timeout::TimeoutConfig::builder()
            .read_timeout(std::time::Duration::from_secs(20))
            .build();
        self
    }

    /// Sends delays longer than `max_delay` (at most SQS's 900 s) through the Scheduler:
    /// the local runner's scaled-down time uses this, so a retry that would wait more than
    /// 900 s still takes the Scheduler path while waiting only seconds.
    pub fn with_max_delay(mut self, max_delay: std::time::Duration) -> Self {
        let ms = i64::try_from(max_delay.as_millis()).unwrap_or(i64::MAX);
        self.max_delay_ms = ms.clamp(1, MAX_SQS_DELAY_SECONDS * 1000);
        self
    }

    /// Sends the batches, [`SEND_CONCURRENCY`] at a time, until one fails: that failure is
    /// the answer, and no further batch is started (the caller sends them all again, so each
    /// one sent before is a copy in the queue).
    async fn send_now(&self, items: &[(PendingRef, i64)]) -> Result<(), QueueError> {
        // The futures are made first: a stream that maps as it goes does not satisfy
        // `async_trait`'s `Send` bound on borrowed items.
        let batches: Vec<_> = items
            .chunks(SQS_BATCH)
            .map(|batch| self.send_batch(batch))
            .collect();
        futures_util::stream::iter(batches)
            .buffer_unordered(SEND_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }

    async fn send_batch(&self, batch: &[(PendingRef, i64)]) -> Result<(), QueueError> {
        let mut request = self.sqs.send_message_batch().queue_url(&self.queue_url);
        for (index, (item, delay)) in batch.iter().enumerate() {
            let body = serde_json::to_string(&DeliveryMessage::from_ref(item))
                .map_err(|e| QueueError(e.to_string()))?;
            let entry = SendMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .message_body(body)
                .delay_seconds(i32::try_from(*delay).unwrap_or(0))
                .message_group_id(item.account_id.as_str())
                .build()
                .map_err(|e| QueueError(e.to_string()))?;
            request = request.entries(entry);
        }
        // Each try waits for SQS's answer as long as a DynamoDB request's does. Set here, not
        // on the client: the same client's long polls (the local runner's receive) wait longer.
        let out = request
            .customize()
            .config_override(
                aws_sdk_sqs::config::Builder::default().timeout_config(self.answer_wait.clone()),
            )
            .send()
            .await
            .map_err(|e| QueueError(error_text(&e)))?;
        if let Some(failed) = out.failed().first() {
            return Err(QueueError(format!(
                "SQS refused {} message(s), e.g. {}: {}",
                out.failed().len(),
                failed.code(),
                failed.message().unwrap_or_default()
            )));
        }
        Ok(())
    }

    async fn schedule(
        &self,
        item: &PendingRef,
        target: &SchedulerTarget,
    ) -> Result<(), QueueError> {
        let body = serde_json::to_string(&DeliveryMessage::from_ref(item))
            .map_err(|e| QueueError(e.to_string()))?;
        let dead_letter = target
            .dead_letter_arn
            .as_ref()
            .map(|arn| DeadLetterConfig::builder().arn(arn).build());
        let result = target
            .client
            .create_schedule()
            .name(schedule_name(&item.delivery_id, item.due))
            .group_name(&target.group)
            .schedule_expression(at_expression(item.due))
            .schedule_expression_timezone("UTC")
            .flexible_time_window(
                FlexibleTimeWindow::builder()
                    .mode(FlexibleTimeWindowMode::Off)
                    .build()
                    .map_err(|e| QueueError(e.to_string()))?,
            )
            .action_after_completion(ActionAfterCompletion::Delete)
            .target(
                Target::builder()
                    .arn(&self.queue_arn)
                    .role_arn(&target.role_arn)
                    .input(body)
                    .set_dead_letter_config(dead_letter)
                    .build()
                    .map_err(|e| QueueError(e.to_string()))?,
            )
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // The same delivery and due time is already scheduled.
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conflict_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(QueueError(error_text(&e))),
        }
    }
}

/// `at(2026-11-30T12:34:56)`, rounded up to the next second (in UTC).
pub fn at_expression(due: Timestamp) -> String {
    let rounded = crate::clock::from_millis((to_millis(due) + 999) / 1000 * 1000);
    format!("at({})", rounded.format("%Y-%m-%dT%H:%M:%S"))
}

/// One name per (delivery, due time): scheduling the same retry twice is a no-op.
pub fn schedule_name(delivery: &DeliveryId, due: Timestamp) -> String {
    format!("{}-{}", delivery, to_millis(due) / 1000)
}

/// The due time a name from `schedule_name` carries (to the second), if it is one.
pub fn schedule_due_hint(name: &str) -> Option<Timestamp> {
    let (_, seconds) = name.rsplit_once('-')?;
    let seconds: i64 = seconds.parse().ok()?;
    Some(crate::clock::from_millis(seconds.checked_mul(1000)?))
}

#[async_trait]
impl Queue for SqsQueue {
    async fn enqueue(&self, items: Vec<PendingRef>) -> Result<(), QueueError> {
        let now = to_millis(self.clock.now());
        let mut soon = Vec::new();
        let mut later = Vec::new();
        for item in items {
            let delay_ms = (to_millis(item.due) - now).max(0);
            let delay = (delay_ms + 999) / 1000;
            match &self.scheduler {
                Some(target) if delay_ms > self.max_delay_ms => later.push((item, target)),
                // Without a scheduler a long delay waits in the queue as long as it may and
                // comes back early; the sender then re-queues it for the rest.
                _ => soon.push((item, delay.min(MAX_SQS_DELAY_SECONDS))),
            }
        }
        // A schedule refused (Scheduler's rate quota, say) does not keep the others, or the
        // messages due soon, from being sent; the first failure is still the answer.
        let schedules: Vec<_> = later
            .iter()
            .map(|(item, target)| self.schedule(item, target))
            .collect();
        let scheduled: Vec<Result<(), QueueError>> = futures_util::stream::iter(schedules)
            .buffer_unordered(SEND_CONCURRENCY)
            .collect()
            .await;
        let sent = self.send_now(&soon).await;
        scheduled.into_iter().collect::<Result<(), _>>().and(sent)
    }

    async fn update_lane(
        &self,
        _endpoint: &EndpointId,
        _max_in_flight: u32,
        _rate_limit_per_second: Option<u32>,
    ) {
        // Senders read an endpoint's limits when they take its slot: nothing is cached here.
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::clock::{add, SystemClock};

    pub(crate) struct Emulated {
        pub queue: SqsQueue,
        pub sqs: aws_sdk_sqs::Client,
        pub queue_url: String,
        pub scheduler: aws_sdk_scheduler::Client,
        pub group: String,
    }

    const SCHEDULE_DLQ: &str = "arn:aws:sqs:us-east-1:123456789012:hooklane-schedule-dlq";

    /// A fresh queue and schedule group on the local AWS emulator.
    pub(crate) async fn emulated_queue() -> Emulated {
        let _ = crate::testing::emulator_client().await;
        let config = crate::aws::load_sdk_config().await;
        let sqs = aws_sdk_sqs::Client::new(&config);
        let scheduler = aws_sdk_scheduler::Client::new(&config);
        let name = format!("q{}", uuid::Uuid::new_v4().simple());
        let queue_url = sqs
            .create_queue()
            .queue_name(&name)
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let arn = sqs
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()
            .remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .unwrap();
        scheduler
            .create_schedule_group()
            .name(&name)
            .send()
            .await
            .unwrap();
        let target = SchedulerTarget {
            client: scheduler.clone(),
            group: name.clone(),
            role_arn: "arn:aws:iam::123456789012:role/hooklane-scheduler".into(),
            dead_letter_arn: Some(SCHEDULE_DLQ.into()),
        };
        Emulated {
            queue: SqsQueue::new(
                sqs.clone(),
                &queue_url,
                arn,
                Some(target),
                Arc::new(SystemClock),
            )
            .with_patient_tries(),
            sqs,
            queue_url,
            scheduler,
            group: name,
        }
    }

    /// The names of the schedules in the emulated group.
    async fn schedule_names(e: &Emulated) -> Vec<String> {
        let listed = e
            .scheduler
            .list_schedules()
            .group_name(&e.group)
            .send()
            .await
            .unwrap();
        listed
            .schedules()
            .iter()
            .filter_map(|s| s.name().map(str::to_owned))
            .collect()
    }

    /// The delivery a queued message is for.
    fn delivery_of(message: &aws_sdk_sqs::types::Message) -> String {
        let (delivery, _, _) = DeliveryMessage::parse(message.body().unwrap()).unwrap();
        delivery.to_string()
    }

    pub(crate) async fn receive(e: &Emulated, wait: i32) -> Vec<aws_sdk_sqs::types::Message> {
        e.sqs
            .receive_message()
            .queue_url(&e.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    fn pending(id: &str, account: &str, due: Timestamp) -> PendingRef {
        PendingRef {
            delivery_id: DeliveryId::parse(id).unwrap(),
            endpoint_id: EndpointId::parse("ep_1").unwrap(),
            account_id: AccountId::parse(account).unwrap(),
            due,
            max_in_flight: 4,
            rate_limit_per_second: None,
        }
    }

    /// A send to SQS whose answer never comes is given up after three tries, as a DynamoDB
    /// request is: the sender queues its follow-ups within its batch, which its function's
    /// timeout covers (the emulator always answers; a peer of the test's own never does).
    #[tokio::test]
    async fn a_send_that_is_never_answered_is_given_up_after_its_tries() {
        use crate::aws::clients::tests::{
            given_up_after_three_tries, never_answering_peer, sdk_at,
        };
        let (address, requests) = never_answering_peer();
        let queue = SqsQueue::new(
            crate::aws::clients::sqs(&sdk_at(address).await, None),
            format!("http://{address}/123456789012/never-answered"),
            "arn:aws:sqs:us-east-1:123456789012:never-answered",
            None,
            Arc::new(SystemClock),
        );
        let now = chrono::Utc::now();
        let call = queue.enqueue(vec![pending("dlv_never", "acme", now)]);
        let error = given_up_after_three_tries(&requests, call).await;
        assert!(error.0.contains("timeout"), "{error:?}");
    }

    #[tokio::test]
    async fn due_work_is_sent_now_and_near_work_after_its_delay() {
        let e = emulated_queue().await;
        let now = chrono::Utc::now();
        e.queue
            .enqueue(vec![
                pending("dlv_now", "acme", now),
                pending("dlv_soon", "globex", add(now, Duration::from_secs(2))),
            ])
            .await
            .unwrap();
        let first = receive(&e, 0).await;
        assert_eq!(first.len(), 1, "only the due one is visible: {first:?}");
        let body = first[0].body().unwrap();
        let (delivery, endpoint, account) = DeliveryMessage::parse(body).unwrap();
        assert_eq!(delivery.as_str(), "dlv_now");
        assert_eq!(endpoint.as_str(), "ep_1");
        assert_eq!(account.as_str(), "acme");
        let group = first[0]
            .attributes()
            .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId));
        assert_eq!(
            group.map(String::as_str),
            Some("acme"),
            "the account is the fair-queue group"
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let second = receive(&e, 2).await;
        assert_eq!(second.len(), 1);
        assert_eq!(delivery_of(&second[0]), "dlv_soon");
    }

    #[tokio::test]
    async fn long_delays_become_one_time_schedules_that_delete_themselves() {
        let e = emulated_queue().await;
        let due = add(chrono::Utc::now(), Duration::from_secs(7200));
        let item = pending("dlv_later", "acme", due);
        e.queue.enqueue(vec![item.clone()]).await.unwrap();
        e.queue.enqueue(vec![item.clone()]).await.unwrap();
        assert!(receive(&e, 0).await.is_empty(), "nothing in the queue yet");
        assert_eq!(
            schedule_names(&e).await.len(),
            1,
            "scheduling twice made one schedule"
        );
        let schedule = e
            .scheduler
            .get_schedule()
            .group_name(&e.group)
            .name(schedule_name(&item.delivery_id, due))
            .send()
            .await
            .unwrap();
        assert_eq!(
            schedule.schedule_expression(),
            Some(at_expression(due).as_str())
        );
        assert!(at_expression(due).starts_with("at(20"));
        assert_eq!(
            schedule.action_after_completion(),
            Some(&ActionAfterCompletion::Delete)
        );
        let target = schedule.target().unwrap();
        assert!(target
            .arn()
            .ends_with(e.queue_url.rsplit('/').next().unwrap()));
        let input = target.input().unwrap();
        assert_eq!(
            DeliveryMessage::parse(input).unwrap().0.as_str(),
            "dlv_later"
        );
        assert_eq!(
            target.sqs_parameters().and_then(|p| p.message_group_id()),
            None,
            "Scheduler documents MessageGroupId for FIFO targets only; the queue is standard"
        );
        assert_eq!(
            target.dead_letter_config().and_then(|d| d.arn()),
            Some(SCHEDULE_DLQ),
            "a schedule Scheduler cannot deliver goes to the schedule dead-letter queue"
        );
    }

    /// Counts a client's requests (once each, however often the SDK tries them again: a
    /// slow host's emulator can outlast the read timeout) and its tries in flight.
    #[derive(Debug, Default)]
    struct InFlight {
        now: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        requests: std::sync::atomic::AtomicUsize,
    }

    #[derive(Debug)]
    struct CountInFlight(Arc<InFlight>);

    impl aws_smithy_runtime_api::client::interceptors::Intercept for CountInFlight {
        fn name(&self) -> &'static str {
            "CountInFlight"
        }

        fn read_before_execution(
            &self,
            _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef<'_>,
            _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
        ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
            self.0
                .requests
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }

        // A try's start and end are paired, whether it is answered, times out or fails.
        fn read_before_attempt(
            &self,
            _context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef<'_>,
            _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
            _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
        ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.0.now.fetch_add(1, SeqCst) + 1;
            self.0.most.fetch_max(now, SeqCst);
            Ok(())
        }

        fn read_after_attempt(
            &self,
            _context: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<'_>,
            _components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
            _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
        ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
            self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    /// A fan-out to many endpoints is hundreds of batches: they go side by side, not one
    /// after another (which took most of the fan-out function's timeout).
    #[tokio::test]
    async fn many_batches_are_sent_side_by_side() {
        let e = emulated_queue().await;
        let counts = Arc::new(InFlight::default());
        let counting = crate::aws::clients::sqs(
            &crate::aws::load_sdk_config().await,
            Some(&crate::aws::clients::SharedInterceptor::new(CountInFlight(
                counts.clone(),
            ))),
        );
        let queue = SqsQueue {
            sqs: counting,
            ..e.queue.clone()
        };
        let now = chrono::Utc::now();
        let items: Vec<_> = (0..200)
            .map(|i| pending(&format!("dlv_{i}"), "acme", now))
            .collect();
        queue.enqueue(items).await.unwrap();
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(
            counts.requests.load(SeqCst),
            20,
            "200 messages in batches of 10"
        );
        let most = counts.most.load(SeqCst);
        assert!(
            most > 1 && most <= SEND_CONCURRENCY,
            "{most} batches in flight at most"
        );
        let mut received = std::collections::BTreeSet::new();
        while received.len() < 200 {
            let messages = receive(&e, 1).await;
            assert!(
                !messages.is_empty(),
                "only {} of 200 arrived",
                received.len()
            );
            received.extend(messages.iter().map(delivery_of));
        }
    }

    /// A schedule Scheduler refuses (its rate quota, say) fails the enqueue, but the work
    /// due soon is in the queue all the same.
    #[tokio::test]
    async fn a_refused_schedule_does_not_keep_due_work_from_the_queue() {
        let e = emulated_queue().await;
        let mut queue = e.queue.clone();
        if let Some(target) = queue.scheduler.as_mut() {
            target.group = format!("{}-missing", e.group);
        }
        let now = chrono::Utc::now();
        let outcome = queue
            .enqueue(vec![
                pending("dlv_later", "acme", add(now, Duration::from_secs(7200))),
                pending("dlv_now", "acme", now),
            ])
            .await;
        assert!(
            outcome.is_err(),
            "the refused schedule is reported: {outcome:?}"
        );
        let queued = receive(&e, 1).await;
        assert_eq!(
            queued.iter().map(delivery_of).collect::<Vec<_>>(),
            ["dlv_now"],
            "the due delivery was sent"
        );
    }

    #[tokio::test]
    async fn a_lower_delay_ceiling_sends_shorter_delays_to_the_scheduler() {
        let e = emulated_queue().await;
        let queue = e.queue.clone().with_max_delay(Duration::from_secs(2));
        let now = chrono::Utc::now();
        queue
            .enqueue(vec![
                pending("dlv_scheduled", "acme", add(now, Duration::from_secs(5))),
                pending("dlv_queued", "acme", now),
            ])
            .await
            .unwrap();
        let names = schedule_names(&e).await;
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("dlv_scheduled-"), "{names:?}");
        let queued = receive(&e, 0).await;
        assert_eq!(queued.len(), 1);
        assert_eq!(delivery_of(&queued[0]), "dlv_queued");
    }

    #[test]
    fn at_expressions_round_up_to_the_second() {
        let due = crate::clock::from_millis(1_700_000_000_001);
        assert_eq!(at_expression(due), "at(2023-11-14T22:13:21)");
        let name = schedule_name(&DeliveryId::parse("dlv_1").unwrap(), due);
        assert_eq!(
            schedule_due_hint(&name),
            Some(crate::clock::from_millis(1_700_000_000_000))
        );
        assert_eq!(schedule_due_hint("someone-elses"), None);
        assert!(DeliveryMessage::parse("{}").is_err());
        assert!(DeliveryMessage::parse(
            r#"{"delivery_id":"a b","endpoint_id":"e","account_id":"a"}"#
        )
        .is_err());
    }

    #[test]
    fn a_schedule_name_of_a_derived_delivery_id_fits_eventbridge_scheduler() {
        // Scheduler refuses names over 64 characters.
        let id = DeliveryId::derived(
            &crate::domain::AccountId::parse(&"a".repeat(128)).unwrap(),
            &crate::domain::EventId::parse(&"e".repeat(128)).unwrap(),
            crate::clock::from_millis(253_402_300_799_000),
            &crate::domain::EndpointId::parse(&"p".repeat(128)).unwrap(),
        );
        let name = schedule_name(&id, crate::clock::from_millis(253_402_300_799_000));
        assert!(name.len() <= 64, "{name} is {} characters", name.len());
    }
}
