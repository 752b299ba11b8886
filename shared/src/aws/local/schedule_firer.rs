//! EventBridge Scheduler, locally: due one-time schedules of the retry group fired into the queue.

use super::*;

pub(super) const SCHEDULE_POLL: Duration = Duration::from_millis(500);

/// What EventBridge Scheduler does for the retry group: at a schedule's `at(...)` time,
/// sends its input to the queue, then deletes it (`ActionAfterCompletion: DELETE`).
pub(super) struct ScheduleFirer {
    pub(super) scheduler: aws_sdk_scheduler::Client,
    pub(super) sqs: aws_sdk_sqs::Client,
    pub(super) group: String,
    pub(super) queue_url: String,
    pub(super) queue_arn: String,
}

/// The time of an `at(yyyy-mm-ddThh:mm:ss)` expression in UTC.
pub fn parse_at_expression(expression: &str) -> Option<Timestamp> {
    let inner = expression.trim().strip_prefix("at(")?.strip_suffix(')')?;
    let naive = chrono::NaiveDateTime::parse_from_str(inner, "%Y-%m-%dT%H:%M:%S").ok()?;
    Some(naive.and_utc())
}

impl ScheduleFirer {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            match self.fire_due(chrono::Utc::now()).await {
                Ok(0) => {}
                Ok(fired) => tracing::info!(fired, group = %self.group, "fired due schedules"),
                Err(error) => tracing::warn!(%error, "cannot fire schedules"),
            }
            if !pause(SCHEDULE_POLL, &mut stop).await {
                return;
            }
        }
    }

    /// Fires the schedules of the group that are due at `now`. Returns how many.
    pub(super) async fn fire_due(&self, now: Timestamp) -> Result<usize, String> {
        let mut names = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = self
                .scheduler
                .list_schedules()
                .group_name(&self.group)
                .set_next_token(next.clone())
                .send()
                .await
                .map_err(|e| error_text(&e))?;
            names.extend(
                page.schedules()
                    .iter()
                    .filter_map(|s| s.name())
                    // Hooklane names its schedules after their time: skip the future ones
                    // without reading them.
                    .filter(|name| schedule_due_hint(name).is_none_or(|due| due <= now))
                    .map(str::to_owned),
            );
            match page.next_token {
                Some(token) if !token.is_empty() => next = Some(token),
                _ => break,
            }
        }
        let mut fired = 0;
        for name in names {
            if self.fire_if_due(&name, now).await? {
                fired += 1;
            }
        }
        Ok(fired)
    }

    pub(super) async fn fire_if_due(&self, name: &str, now: Timestamp) -> Result<bool, String> {
        let schedule = match self
            .scheduler
            .get_schedule()
            .group_name(&self.group)
            .name(name)
            .send()
            .await
        {
            Ok(schedule) => schedule,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(error_text(&e)),
        };
        let timezone = schedule.schedule_expression_timezone().unwrap_or("UTC");
        let Some(at) = schedule
            .schedule_expression()
            .filter(|_| timezone == "UTC")
            .and_then(parse_at_expression)
        else {
            tracing::debug!(schedule = %name, "not a one-time UTC schedule; left alone");
            return Ok(false);
        };
        if at > now {
            return Ok(false);
        }
        let Some(target) = schedule.target().filter(|t| t.arn() == self.queue_arn) else {
            tracing::debug!(schedule = %name, "targets another resource; left alone");
            return Ok(false);
        };
        let Some(input) = target.input() else {
            tracing::warn!(schedule = %name, "schedule without input; left alone");
            return Ok(false);
        };
        let group_id = target
            .sqs_parameters()
            .and_then(|p| p.message_group_id())
            .map(str::to_owned);
        // Sent by EventBridge Scheduler with the schedule's role.
        let sent = self
            .sqs
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(input)
            .set_message_group_id(group_id)
            .send();
        as_function(SCHEDULER_ROLE, sent)
            .await
            .map_err(|e| error_text(&e))?;
        // Sent first, deleted after: a failure in between sends the message twice, which
        // the sender shrugs off (the delivery is no longer pending, or not yet due).
        match self
            .scheduler
            .delete_schedule()
            .group_name(&self.group)
            .name(name)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                Ok(true)
            }
            Err(e) => Err(error_text(&e)),
        }
    }
}
