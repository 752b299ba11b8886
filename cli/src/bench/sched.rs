//! Where `serve`'s threads spent a phase: on a core, or ready and waiting for one. From
//! Linux's per-thread `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on a core, nanoseconds
//! waiting on a run queue), so it tells a saturated writer from saturated cores.

use std::time::{Duration, Instant};

use hooklane::store::sqlite::STORE_THREAD;

/// Nanoseconds so far: the store thread's on a core and waiting, and all threads' waiting.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Totals {
    store_on_cpu: u64,
    store_waiting: u64,
    serve_waiting: u64,
}

impl Totals {
    fn read(pid: u32) -> Option<Self> {
        let mut totals = Self {
            store_on_cpu: 0,
            store_waiting: 0,
            serve_waiting: 0,
        };
        let mut found_store = false;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            // A thread that ended between the listing and the read is no longer counted.
            let (Ok(name), Ok(stat)) = (
                std::fs::read_to_string(task.path().join("comm")),
                std::fs::read_to_string(task.path().join("schedstat")),
            ) else {
                continue;
            };
            let Some((on_cpu, waiting)) = parse_schedstat(&stat) else {
                continue;
            };
            totals.serve_waiting += waiting;
            if name.trim_end() == STORE_THREAD {
                found_store = true;
                totals.store_on_cpu += on_cpu;
                totals.store_waiting += waiting;
            }
        }
        found_store.then_some(totals)
    }
}

/// `schedstat`'s first two fields: time on a core and time waiting for one, in ns.
fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

/// A phase being measured; `None` inside when there is no `serve` of ours to read (`--url`).
pub(super) struct Phase {
    start: Option<(u32, Totals, Instant)>,
}

/// A phase's shares of its wall time. `store_on_cpu` near 1 means the one writer is what
/// every publish and record waits for; `serve_waiting` is how many of `serve`'s threads were,
/// on average, ready to run with no core free.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct Shares {
    pub store_on_cpu: Option<f64>,
    pub store_waiting: Option<f64>,
    pub serve_waiting: Option<f64>,
}

impl Phase {
    pub(super) fn start(pid: Option<u32>) -> Self {
        let start = pid.and_then(|pid| Some((pid, Totals::read(pid)?, Instant::now())));
        Self { start }
    }

    pub(super) fn end(self) -> Shares {
        let Some((pid, before, started)) = self.start else {
            return Shares::default();
        };
        match Totals::read(pid) {
            Some(after) => shares(before, after, started.elapsed()),
            None => Shares::default(),
        }
    }
}

fn shares(before: Totals, after: Totals, wall: Duration) -> Shares {
    let wall_ns = wall.as_nanos() as f64;
    if wall_ns <= 0.0 {
        return Shares::default();
    }
    let share = |from: u64, to: u64| Some(super::round3(to.saturating_sub(from) as f64 / wall_ns));
    Shares {
        store_on_cpu: share(before.store_on_cpu, after.store_on_cpu),
        store_waiting: share(before.store_waiting, after.store_waiting),
        serve_waiting: share(before.serve_waiting, after.serve_waiting),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_time_on_a_core_and_time_waiting() {
        assert_eq!(
            parse_schedstat("2361000000 2980000000 5120\n"),
            Some((2_361_000_000, 2_980_000_000))
        );
        assert_eq!(parse_schedstat("12"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn shares_are_of_the_phase_wall_time() {
        let before = Totals {
            store_on_cpu: 1_000_000_000,
            store_waiting: 0,
            serve_waiting: 500_000_000,
        };
        let after = Totals {
            store_on_cpu: 1_700_000_000,
            store_waiting: 200_000_000,
            serve_waiting: 2_500_000_000,
        };
        let got = shares(before, after, Duration::from_secs(1));
        assert_eq!(got.store_on_cpu, Some(0.7));
        assert_eq!(got.store_waiting, Some(0.2));
        assert_eq!(got.serve_waiting, Some(2.0));
    }

    #[test]
    fn the_store_thread_is_found_by_its_name() {
        let (ready, is_ready) = std::sync::mpsc::channel::<()>();
        let (done, is_done) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(STORE_THREAD.into())
            .spawn(move || {
                // Busy until this thread has had 20 ms on a core, by its own count.
                let own = || {
                    std::fs::read_to_string("/proc/thread-self/schedstat")
                        .ok()
                        .and_then(|s| parse_schedstat(&s))
                        .map_or(0, |(on_cpu, _)| on_cpu)
                };
                while own() < 20_000_000 {
                    std::hint::black_box(own());
                }
                let _ = ready.send(());
                let _ = is_done.recv();
            })
            .expect("spawn");
        is_ready.recv().expect("the thread ran");
        let totals = Totals::read(std::process::id()).expect("the named thread is found");
        assert!(totals.store_on_cpu >= 20_000_000, "{totals:?}");
        assert!(totals.serve_waiting >= totals.store_waiting, "{totals:?}");
        let _ = done.send(());
        thread.join().expect("join");
    }
}
