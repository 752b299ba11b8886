//! Who the relay leaves alone for a while. An account Hooklane answers "not now" (its 429
//! `rate_limited`, the account's publish limit; or its 500 `unreadable_item`) waits until the
//! answer's `Retry-After`, or its own backoff, while the other accounts' rows go on; an API
//! that cannot be reached or is down as a whole pauses every publish.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::Backoff;

/// The longest pause: a `Retry-After` further off (a proxy's, say) is cut to this, so that a
/// wrong header cannot stop an account for hours.
pub const MAX_PAUSE: Duration = Duration::from_secs(300);

/// The shortest pause after a retryable answer: `Retry-After: 0` must not turn the relay into
/// a busy loop against the API (a date already past is no answer: the backoff applies).
pub const MIN_PAUSE: Duration = Duration::from_millis(100);

/// Failures in a row after which an account's pause is logged at `ERROR`.
pub const STALLED_AFTER: u32 = 5;

/// One pause: until when, and how many failures in a row (for the backoff without
/// `Retry-After`).
#[derive(Debug, Default)]
struct Pause {
    until: Option<Instant>,
    backoff: Backoff,
}

impl Pause {
    /// Pauses after a retryable answer: for `retry_after` when the answer gave one, else for
    /// the backoff's next step; with `at_least_step`, for the longer of the two. Always within
    /// [`MIN_PAUSE`], [`MAX_PAUSE`]. The pause's length.
    fn fail(
        &mut self,
        retry_after: Option<Duration>,
        at_least_step: bool,
        now: Instant,
    ) -> Duration {
        // Counted with a `Retry-After` too: a next answer without one goes on from here.
        let step = self.backoff.pause();
        let pause = match retry_after {
            Some(after) if at_least_step => after.max(step),
            Some(after) => after,
            None => step,
        }
        .clamp(MIN_PAUSE, MAX_PAUSE);
        self.until = Some(now + pause);
        pause
    }

    fn failures(&self) -> u32 {
        self.backoff.failures
    }

    fn paused_at(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| until > now)
    }
}

/// The pauses of the accounts and of the API as a whole.
#[derive(Debug, Default)]
pub struct Pauses {
    accounts: HashMap<String, Pause>,
    api: Pause,
    /// Since when Hooklane has refused the token (its own 401), with no answer that took it.
    token_refused_since: Option<Instant>,
}

impl Pauses {
    /// Pauses `account` (see [`Pause::fail`]); how long.
    pub fn pause_account(
        &mut self,
        account: &str,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Duration {
        // Exactly as told: Hooklane's own answer knows when the account's limit has room.
        self.accounts
            .entry(account.to_owned())
            .or_default()
            .fail(retry_after, false, now)
    }

    /// `account` had an answer that was not "not now": its next failure starts the backoff
    /// again.
    pub fn resume_account(&mut self, account: &str) {
        self.accounts.remove(account);
    }

    /// The accounts paused at `now`, sorted: the read leaves their rows out. An account whose
    /// pause ended long ago and that was not answered since (its rows deleted, say) is
    /// forgotten, so that the map does not grow with every account that ever waited.
    pub fn paused_accounts(&mut self, now: Instant) -> Vec<String> {
        self.accounts
            .retain(|_, pause| pause.until.is_some_and(|until| until + MAX_PAUSE > now));
        let mut paused: Vec<String> = self
            .accounts
            .iter()
            .filter(|(_, pause)| pause.paused_at(now))
            .map(|(account, _)| account.clone())
            .collect();
        paused.sort_unstable();
        paused
    }

    /// Whether `account` failed [`STALLED_AFTER`] times in a row or more.
    pub fn stalled(&self, account: &str) -> bool {
        self.accounts
            .get(account)
            .is_some_and(|pause| pause.failures() >= STALLED_AFTER)
    }

    /// When the first account pause still running at `now` ends.
    pub fn next_resume(&self, now: Instant) -> Option<Instant> {
        self.accounts
            .values()
            .filter_map(|pause| pause.until)
            .filter(|until| *until > now)
            .min()
    }

    /// Pauses every publish (see [`Pause::fail`]), for at least the backoff's step; how long.
    pub fn pause_api(&mut self, retry_after: Option<Duration>, now: Instant) -> Duration {
        // What answers may be a proxy's or a gateway's: a `Retry-After: 0` (or a date past)
        // on each answer must not keep the whole relay at the shortest pause.
        self.api.fail(retry_after, true, now)
    }

    /// The API answered (it took the token): its next failure starts the backoff again.
    pub fn api_answered(&mut self) {
        self.api = Pause::default();
        self.token_refused_since = None;
    }

    /// Hooklane refused the token at `now`: for how long it has (zero the first time).
    /// Another failure in between (the API down) does not start it again; an answer does.
    pub fn token_refused(&mut self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.token_refused_since.get_or_insert(now))
    }

    /// When the pause of every publish ends, if it runs at `now`.
    pub fn api_paused_until(&self, now: Instant) -> Option<Instant> {
        self.api.until.filter(|_| self.api.paused_at(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paused_account_is_left_out_until_its_retry_after() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        let pause = pauses.pause_account("hot", Some(Duration::from_secs(8)), t0);
        assert_eq!(pause, Duration::from_secs(8));
        assert_eq!(pauses.paused_accounts(t0), ["hot"]);
        assert_eq!(
            pauses.paused_accounts(t0 + Duration::from_millis(7_999)),
            ["hot"]
        );
        assert_eq!(pauses.next_resume(t0), Some(t0 + Duration::from_secs(8)));
        // Only that account: the API, and the others, go on.
        assert_eq!(pauses.api_paused_until(t0), None);
        assert!(pauses
            .paused_accounts(t0 + Duration::from_secs(8))
            .is_empty());
        assert_eq!(pauses.next_resume(t0 + Duration::from_secs(8)), None);
    }

    #[test]
    fn pauses_are_capped_and_floored() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        assert_eq!(
            pauses.pause_account("a", Some(Duration::from_secs(3600)), t0),
            MAX_PAUSE
        );
        assert_eq!(
            pauses.pause_account("b", Some(Duration::MAX), t0),
            MAX_PAUSE
        );
        assert_eq!(
            pauses.pause_account("c", Some(Duration::ZERO), t0),
            MIN_PAUSE
        );
        assert_eq!(
            pauses.pause_api(Some(Duration::from_secs(86_400)), t0),
            MAX_PAUSE
        );
        assert_eq!(pauses.paused_accounts(t0), ["a", "b", "c"]);
        assert_eq!(pauses.next_resume(t0), Some(t0 + MIN_PAUSE));
    }

    #[test]
    fn without_retry_after_each_account_backs_off_on_its_own() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        let steps: Vec<u128> = (0..4)
            .map(|_| pauses.pause_account("a", None, t0).as_millis())
            .collect();
        assert_eq!(steps, [200, 400, 800, 1600]);
        // Another account starts at the first step; a Retry-After still counts as a failure.
        assert_eq!(pauses.pause_account("b", None, t0).as_millis(), 200);
        pauses.pause_account("b", Some(Duration::from_secs(1)), t0);
        assert_eq!(pauses.pause_account("b", None, t0).as_millis(), 800);
        // An answer that is not "not now" starts it again.
        pauses.resume_account("a");
        assert_eq!(pauses.pause_account("a", None, t0).as_millis(), 200);
        assert_eq!(pauses.paused_accounts(t0), ["a", "b"]);
    }

    #[test]
    fn an_api_pause_holds_every_account_and_ends() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        assert_eq!(pauses.pause_api(None, t0), Duration::from_millis(200));
        assert_eq!(pauses.pause_api(None, t0), Duration::from_millis(400));
        assert_eq!(
            pauses.api_paused_until(t0),
            Some(t0 + Duration::from_millis(400))
        );
        assert_eq!(
            pauses.api_paused_until(t0 + Duration::from_millis(400)),
            None
        );
        // A 503's Retry-After is honoured.
        assert_eq!(
            pauses.pause_api(Some(Duration::from_secs(30)), t0),
            Duration::from_secs(30)
        );
        assert!(pauses.paused_accounts(t0).is_empty());
        pauses.api_answered();
        assert_eq!(pauses.pause_api(None, t0), Duration::from_millis(200));
    }

    /// `Retry-After: 0`, or a date already past, on every answer of an API down as a whole:
    /// its pause still grows with the backoff. An account's keeps its `Retry-After` exactly.
    #[test]
    fn an_api_pause_is_never_shorter_than_its_backoff() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        let steps: Vec<u128> = (0..4)
            .map(|_| pauses.pause_api(Some(Duration::ZERO), t0).as_millis())
            .collect();
        assert_eq!(steps, [200, 400, 800, 1600]);
        // A longer Retry-After than the step is honoured.
        assert_eq!(
            pauses.pause_api(Some(Duration::from_secs(30)), t0),
            Duration::from_secs(30)
        );
        let one = Some(Duration::from_secs(1));
        let account: Vec<u128> = (0..4)
            .map(|_| pauses.pause_account("a", one, t0).as_millis())
            .collect();
        assert_eq!(account, [1000, 1000, 1000, 1000]);
    }

    /// An account that fails again and again (an item that cannot be read: retrying will not
    /// help) is stalled from its fifth failure in a row, until it is answered.
    #[test]
    fn an_account_failing_in_a_row_is_stalled() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        for _ in 1..STALLED_AFTER {
            pauses.pause_account("a", None, t0);
            assert!(!pauses.stalled("a"));
        }
        pauses.pause_account("a", Some(Duration::from_secs(1)), t0);
        assert!(pauses.stalled("a"));
        pauses.pause_account("a", None, t0);
        assert!(pauses.stalled("a"));
        assert!(!pauses.stalled("b"));
        pauses.resume_account("a");
        assert!(!pauses.stalled("a"));
    }

    #[test]
    fn accounts_long_past_their_pause_are_forgotten() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.pause_account("gone", None, t0);
        pauses.pause_account("gone", None, t0);
        // Its rows were deleted, say, and it was never answered again.
        let later = t0 + MAX_PAUSE * 3;
        assert!(pauses.paused_accounts(later).is_empty());
        assert_eq!(pauses.pause_account("gone", None, later).as_millis(), 200);
    }

    /// How long the token has been refused counts from the first refusal; an outage in
    /// between does not start it again, an answer that took the token does.
    #[test]
    fn a_refused_token_counts_from_its_first_refusal_until_an_answer() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        assert_eq!(pauses.token_refused(t0), Duration::ZERO);
        pauses.pause_api(None, t0);
        let later = t0 + Duration::from_secs(4);
        assert_eq!(pauses.token_refused(later), Duration::from_secs(4));
        pauses.api_answered();
        assert_eq!(pauses.token_refused(later), Duration::ZERO);
    }
}
