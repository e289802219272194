//! A team of threads for one decode step: every worker runs the whole step on its share of
//! each product's rows and meets the others at a spinning barrier between dependent phases,
//! so a token costs one thread start per worker instead of a pool wake-up per product; and
//! [`on_pool`], which runs a prefill on rayon's workers for the same reason.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    /// Waits that outlasted the spin and had to yield: a worker lost its core.
    yields: AtomicUsize,
}

impl SpinBarrier {
    pub(crate) fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            yields: AtomicUsize::new(0),
        }
    }

    /// How many waits so far outlasted the spin (see [`Contention`]).
    pub(crate) fn yields(&self) -> usize {
        self.yields.load(Ordering::Relaxed)
    }

    /// Returns once all `n` workers have called it (for this generation).
    pub(crate) fn wait(&self) {
        if self.n <= 1 {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                if spins == 1 << 14 {
                    self.yields.fetch_add(1, Ordering::Relaxed);
                }
                // A worker was descheduled (another process has the core): let it run.
                std::thread::yield_now();
            }
        }
    }
}

/// Whether the machine's cores are busy with other work: a team whose workers keep losing
/// their core waits at every barrier for a descheduled one (a step 5-10x slower than one
/// thread), so after a contended step the next [`Contention::SOLO_STEPS`] run on the calling
/// thread alone, then the team is tried again. Process-wide, as the contention is.
pub(crate) struct Contention;

static SOLO_LEFT: AtomicUsize = AtomicUsize::new(0);

impl Contention {
    /// Steps run alone after a contended one.
    pub(crate) const SOLO_STEPS: usize = 64;
    /// Yields in one step that mark it contended: a busy core makes nearly every one of a step's
    /// 90-150 barriers yield, an idle machine's scheduling noise a few.
    const YIELDS: usize = 16;

    /// The workers for the next step: `n`, or 1 while recovering from contention.
    pub(crate) fn workers(n: usize) -> usize {
        if n > 1 && SOLO_LEFT.load(Ordering::Relaxed) > 0 {
            SOLO_LEFT.fetch_sub(1, Ordering::Relaxed);
            return 1;
        }
        n
    }

    /// Records how a team step went (its barrier's yields).
    pub(crate) fn record(barrier: &SpinBarrier) {
        if barrier.yields() >= Self::YIELDS {
            tracing::debug!(
                yields = barrier.yields(),
                "decode team contended: next steps on one thread"
            );
            SOLO_LEFT.store(Self::SOLO_STEPS, Ordering::Relaxed);
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

    /// A worker that loses its core (here: sleeps) makes the others yield; such a step sends the
    /// next steps to one thread, then the team comes back.
    #[test]
    fn a_contended_step_runs_the_next_ones_alone() {
        let barrier = SpinBarrier::new(2);
        run(2, |w, _| {
            for _ in 0..Contention::YIELDS {
                if w == 1 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                barrier.wait();
            }
        });
        assert!(barrier.yields() >= Contention::YIELDS, "{} yields", barrier.yields());
        Contention::record(&barrier);
        let solo = (0..Contention::SOLO_STEPS)
            .filter(|_| Contention::workers(2) == 1)
            .count();
        assert_eq!(solo, Contention::SOLO_STEPS);
        assert_eq!(Contention::workers(2), 2);
        // An uncontended step changes nothing.
        let calm = SpinBarrier::new(2);
        run(2, |_, _| calm.wait());
        Contention::record(&calm);
        assert_eq!(Contention::workers(2), 2);
    }
}
