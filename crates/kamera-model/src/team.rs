//! A team of threads for one decode step: every worker runs the whole step on its share of
//! each product's rows and meets the others at a spinning barrier between dependent phases,
//! so a token costs one thread start per worker instead of a pool wake-up per product; and
//! [`on_pool`], which runs a prefill on rayon's workers for the same reason.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` on a worker of rayon's pool (inline when already on one): a prefill's products
/// and attention are each a parallel region, and from a thread outside the pool every region
/// would also put the caller to sleep and wake it again (tens of µs each in a VM).
pub(crate) fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// A barrier that spins (then yields) instead of sleeping: a phase of a decode step lasts
/// microseconds, less than a futex wake-up.
pub(crate) struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    pub(crate) fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    /// Returns once all `n` workers have called it (for this generation), with the
    /// nanoseconds this caller waited for the others (0 for the last to arrive).
    pub(crate) fn wait(&self) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return 0;
        }
        let start = Instant::now();
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                // A worker was descheduled (another process has the core): let it run.
                std::thread::yield_now();
            }
        }
        start.elapsed().as_nanos() as u64
    }
}

/// Whether the machine's cores are busy with other work: a team whose workers keep losing
/// their core waits at every barrier for a descheduled one (a step 5-10x slower than one
/// thread), so after a contended step the next [`Contention::SOLO_STEPS`] run on the calling
/// thread alone, then the team is tried again. Process-wide, as the contention is.
///
/// A step is contended when a worker spent at least [`Contention::WAIT_SHARE`] of it waiting at
/// the barriers: on an idle machine a worker waits about 3% of a step (measured on a 2-core
/// VM, rows taken in chunks), while a worker that shares its core with another busy thread
/// leaves the others waiting half of it or more. (Counting waits that outlast a spin fired on every step of an idle 2-core VM,
/// whose scheduling noise makes 10-30 of a step's ~120 barriers wait long: issue 36.)
pub(crate) struct Contention;

static SOLO_LEFT: AtomicUsize = AtomicUsize::new(0);
static TEAM_STEPS: AtomicUsize = AtomicUsize::new(0);
static SOLO_STEPS: AtomicUsize = AtomicUsize::new(0);
static CONTENDED_STEPS: AtomicUsize = AtomicUsize::new(0);
/// Contended team steps in a row.
static STREAK: AtomicUsize = AtomicUsize::new(0);

/// How the process's decode steps ran so far ([`decode_team_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct TeamStats {
    /// Steps run by a team of two or more threads.
    pub team_steps: usize,
    /// Steps run on one thread while the team was available (after a contended step).
    pub solo_steps: usize,
    /// Team steps found contended (each sends the next steps to one thread).
    pub contended_steps: usize,
}

impl TeamStats {
    /// The steps since `earlier`.
    pub fn since(self, earlier: TeamStats) -> TeamStats {
        TeamStats {
            team_steps: self.team_steps - earlier.team_steps,
            solo_steps: self.solo_steps - earlier.solo_steps,
            contended_steps: self.contended_steps - earlier.contended_steps,
        }
    }
}

/// How this process's decode steps ran so far: teams, single-thread steps after contention, and
/// contended team steps.
pub fn decode_team_stats() -> TeamStats {
    TeamStats {
        team_steps: TEAM_STEPS.load(Ordering::Relaxed),
        solo_steps: SOLO_STEPS.load(Ordering::Relaxed),
        contended_steps: CONTENDED_STEPS.load(Ordering::Relaxed),
    }
}

impl Contention {
    /// Steps run alone after [`Contention::STREAK`] contended ones in a row.
    pub(crate) const SOLO_STEPS: usize = 64;
    /// Contended steps in a row that send the next ones to one thread: a few slow steps (a page
    /// fault, the first steps after a parallel prefill while the pool's threads wind down) are
    /// not another process on the cores, which stays. With one, the first steps after a bf16
    /// prefill sent a third of SmolLM2's decodes to one thread on the AMX Xeon (55-58 against
    /// 93-100 tok/s); with two, still one run in four.
    pub(crate) const STREAK: usize = 4;
    /// The share of a step one worker spent waiting that marks it contended.
    pub(crate) const WAIT_SHARE: f64 = 0.4;

    /// The workers for the next step: `n`, or 1 while recovering from contention.
    pub(crate) fn workers(n: usize) -> usize {
        if n > 1 && SOLO_LEFT.load(Ordering::Relaxed) > 0 {
            SOLO_LEFT.fetch_sub(1, Ordering::Relaxed);
            SOLO_STEPS.fetch_add(1, Ordering::Relaxed);
            return 1;
        }
        n
    }

    /// Records how a team step went: its length and each worker's time at the barriers.
    pub(crate) fn record(step: Duration, waited_ns: &[u64]) {
        if waited_ns.len() < 2 {
            return;
        }
        TEAM_STEPS.fetch_add(1, Ordering::Relaxed);
        let worst = waited_ns.iter().copied().max().unwrap_or(0) as f64;
        let share = worst / (step.as_nanos() as f64).max(1.0);
        if share >= Self::WAIT_SHARE {
            tracing::debug!(share = format!("{share:.2}"), "decode team step contended");
            CONTENDED_STEPS.fetch_add(1, Ordering::Relaxed);
            if STREAK.fetch_add(1, Ordering::Relaxed) + 1 >= Self::STREAK {
                STREAK.store(0, Ordering::Relaxed);
                SOLO_LEFT.store(Self::SOLO_STEPS, Ordering::Relaxed);
            }
        } else {
            STREAK.store(0, Ordering::Relaxed);
        }
    }
}

/// A buffer the team shares: workers write disjoint parts in one phase and read all of it in
/// a later one, the phases separated by [`SpinBarrier::wait`].
pub(crate) struct Shared {
    ptr: *mut f32,
    len: usize,
    _own: Box<[UnsafeCell<f32>]>,
}

// SAFETY: access follows the phase discipline above (disjoint writes, reads after a barrier).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    pub(crate) fn zeros(len: usize) -> Shared {
        let own: Box<[UnsafeCell<f32>]> = (0..len).map(|_| UnsafeCell::new(0.0)).collect();
        // UnsafeCell<f32> has the layout of f32.
        let ptr = UnsafeCell::raw_get(own.as_ptr());
        Shared { ptr, len, _own: own }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The whole buffer, to read.
    ///
    /// # Safety
    /// No worker writes to it in the current phase.
    pub(crate) unsafe fn all(&self) -> &[f32] {
        // SAFETY: in bounds; the caller guarantees no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// `range` of the buffer, to write.
    ///
    /// # Safety
    /// No other worker reads or writes `range` in the current phase.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, range: Range<usize>) -> &mut [f32] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "Shared::part out of bounds"
        );
        // SAFETY: in bounds; the caller guarantees exclusive access to the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

/// Worker `w` of `n`'s share of `0..total`.
pub(crate) fn share(total: usize, w: usize, n: usize) -> Range<usize> {
    total * w / n..total * (w + 1) / n
}

/// Runs `work(w, n)` on `n` workers: the calling thread is worker 0, the others are scoped
/// threads started for this call.
pub(crate) fn run<R: Send>(n: usize, work: impl Fn(usize, usize) -> R + Sync) -> Vec<R> {
    if n <= 1 {
        return vec![work(0, 1)];
    }
    std::thread::scope(|s| {
        let work = &work;
        let others: Vec<_> = (1..n).map(|w| s.spawn(move || work(w, n))).collect();
        let mut out = vec![work(0, n)];
        for h in others {
            match h.join() {
                Ok(r) => out.push(r),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_see_each_others_writes_after_the_barrier() {
        let n = 3;
        let buf = Shared::zeros(30);
        let barrier = SpinBarrier::new(n);
        let sums = run(n, |w, n| {
            let mut seen = Vec::new();
            for round in 0..200 {
                // SAFETY: each worker writes its own share; reads follow the barrier.
                unsafe {
                    buf.part(share(buf.len(), w, n))
                        .iter_mut()
                        .for_each(|v| *v = (round * 10 + w) as f32);
                }
                barrier.wait();
                let total: f32 = unsafe { buf.all() }.iter().sum();
                seen.push(total);
                barrier.wait();
            }
            seen
        });
        for (round, t) in sums[0].iter().enumerate() {
            let want: f32 = (0..n).map(|w| 10.0 * (round * 10 + w) as f32).sum();
            assert_eq!(*t, want, "round {round}");
        }
        assert!(sums.iter().all(|s| *s == sums[0]));
        assert_eq!(share(10, 0, 3), 0..3);
        assert_eq!(share(10, 2, 3), 6..10);
    }

    /// A worker that loses its core (here: sleeps) makes the others wait most of the step; a
    /// streak of such steps one short changes nothing, a whole one sends the next steps to one
    /// thread, then the team comes back.
    #[test]
    fn a_contended_step_runs_the_next_ones_alone() {
        let barrier = SpinBarrier::new(2);
        let start = Instant::now();
        let waited = run(2, |w, _| {
            let mut waited = 0;
            for _ in 0..8 {
                if w == 1 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                waited += barrier.wait();
            }
            waited
        });
        let step = start.elapsed();
        assert!(
            waited[0] as f64 >= Contention::WAIT_SHARE * step.as_nanos() as f64,
            "worker 0 waited {} ns of {step:?}",
            waited[0]
        );
        let before = decode_team_stats();
        for _ in 1..Contention::STREAK {
            Contention::record(step, &waited);
        }
        assert_eq!(Contention::workers(2), 2, "a streak one short");
        Contention::record(Duration::from_millis(10), &[1_000_000, 0]);
        for _ in 0..Contention::STREAK {
            Contention::record(step, &waited);
        }
        let solo = (0..Contention::SOLO_STEPS)
            .filter(|_| Contention::workers(2) == 1)
            .count();
        assert_eq!(solo, Contention::SOLO_STEPS);
        assert_eq!(Contention::workers(2), 2);
        let seen = decode_team_stats().since(before);
        assert!(
            seen.contended_steps >= 2 * Contention::STREAK - 1 && seen.solo_steps >= Contention::SOLO_STEPS,
            "{seen:?}"
        );
        // A balanced step changes nothing.
        Contention::record(Duration::from_millis(10), &[1_000_000, 0]);
        assert_eq!(Contention::workers(2), 2);
    }
}
