//! What a saturated endpoint's backlog costs on AWS, with the sender's re-queue rule
//! ([`busy_delay_drawn`]) modelled over time: every message that finds the endpoint's slots
//! held goes back to the queue, and each trip is a receive, a delivery read and a send that
//! the emulator neither bills nor throttles. The model is one endpoint with a few slots, each
//! request taking as long as a slow endpoint does, and N messages due at once.

use std::{cmp::Reverse, collections::BinaryHeap, time::Duration};

use rand::{rngs::StdRng, Rng, SeedableRng};

use super::{busy_delay_drawn, Busy, BUSY_REQUEUE_LONGEST};

/// The endpoint: its in-flight cap, and how long each request takes it.
const SLOTS: usize = 4;
const REQUEST: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Drained {
    /// Messages handled, the last one of each delivery (its attempt) included.
    trips: u64,
    /// When the last attempt started.
    last_start: Duration,
}

impl Drained {
    fn trips_per_delivery(&self, deliveries: u64) -> f64 {
        self.trips as f64 / deliveries as f64
    }
}

/// Runs `deliveries` messages, due at once and handed out over the first second, to the
/// endpoint until every one has been attempted. `rule` is how long a message that finds every
/// slot held goes back for, given how long its delivery has waited.
fn drain(deliveries: u64, seed: u64, rule: impl Fn(Duration, &mut StdRng) -> Duration) -> Drained {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut arrivals: BinaryHeap<Reverse<(Duration, u64)>> = (0..deliveries)
        .map(|id| Reverse((Duration::from_millis(rng.random_range(0..1_000)), id)))
        .collect();
    let mut free_at = [Duration::ZERO; SLOTS];
    let mut drained = Drained {
        trips: 0,
        last_start: Duration::ZERO,
    };
    while let Some(Reverse((now, id))) = arrivals.pop() {
        drained.trips += 1;
        match free_at.iter_mut().find(|free| **free <= now) {
            Some(slot) => {
                *slot = now + REQUEST;
                drained.last_start = drained.last_start.max(now);
            }
            // Due at 0: it has waited `now`.
            None => arrivals.push(Reverse((now + rule(now, &mut rng), id))),
        }
    }
    drained
}

/// How long the endpoint itself needs for the backlog, one request per slot at a time.
fn in_line(deliveries: u64) -> Duration {
    REQUEST * u32::try_from(deliveries.div_ceil(SLOTS as u64)).unwrap_or(u32::MAX)
}

fn backing_off(waited: Duration, rng: &mut StdRng) -> Duration {
    busy_delay_drawn(Busy::AllSlotsHeld, waited, rng)
}

/// The same rule with the wait left out: 5–15 s every time.
fn flat(_: Duration, rng: &mut StdRng) -> Duration {
    busy_delay_drawn(Busy::AllSlotsHeld, Duration::ZERO, rng)
}

/// A backlog of N messages for a saturated endpoint makes a bounded number of trips per
/// delivery, about N / (slots × 300 s / request time) once the waits reach their longest,
/// where a flat 5–15 s made N / (slots × 10 s / request time): the backlog's cost grows with
/// N, not N². The endpoint is kept busy meanwhile: the backlog drains at its pace, plus at
/// most a few of the longest waits at the end.
#[test]
fn a_saturated_endpoints_backlog_comes_round_at_a_bounded_rate_and_still_drains_at_its_pace() {
    let table = include_str!("../../../../docs/PERFORMANCE.md");
    for (deliveries, seed) in [(100, 1), (2_000, 2), (20_000, 3)] {
        let backing = drain(deliveries, seed, backing_off);
        let ideal = in_line(deliveries);
        let trips = backing.trips_per_delivery(deliveries);
        // The flat rule's trips grow with N: its largest run would take the test a minute.
        let flat = (deliveries <= 2_000).then(|| drain(deliveries, seed, flat));
        // docs/PERFORMANCE.md's table is this run's.
        let row = format!(
            "| {} | {} s | {} s | {trips:.1} |",
            thousands(deliveries),
            thousands(secs(ideal)),
            thousands(secs(backing.last_start)),
        );
        println!("{row}");
        assert!(table.contains(&row), "docs/PERFORMANCE.md has no row {row}");
        if let Some(flat) = &flat {
            let cell = format!(
                " {:.1}, drained in {} s |",
                flat.trips_per_delivery(deliveries),
                thousands(secs(flat.last_start))
            );
            println!("  with a flat 5–15 s:{cell}");
            assert!(table.contains(&format!("{row}{cell}")), "no {row}{cell}");
        }
        // Past its first minutes a message waits 150–300 s a trip, for half the drain on
        // average; a few more trips while its wait grows.
        let waits = ideal.as_secs_f64() / BUSY_REQUEUE_LONGEST.as_secs_f64();
        assert!(
            trips <= waits + 12.0,
            "{deliveries}: {trips:.1} trips per delivery, for {waits:.1} longest waits in line"
        );
        assert!(
            backing.last_start <= ideal.mul_f64(1.1) + BUSY_REQUEUE_LONGEST * 3,
            "{deliveries}: drained in {:?}, the endpoint's own pace is {ideal:?}",
            backing.last_start
        );
    }
}

fn secs(d: Duration) -> u64 {
    d.as_secs_f64().round() as u64
}

/// `20000` as the docs write it: `20,000`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
