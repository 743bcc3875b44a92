//! A small persistent thread pool for work-sharing loops: `run(f)` calls `f(0)` on the
//! caller and `f(i)` on each worker that arrives while the caller is still in `f(0)`, and
//! returns when every call that started has returned.
//!
//! So `f` must be a loop that takes work items from a shared source until none are left:
//! any subset of the threads, the caller alone included, then does all the work. That is
//! what keeps a step fast on a machine shared with other processes: a worker that the OS
//! has not scheduled is not waited for (an earlier version waited for every worker and
//! decoded 8× slower under load).
//!
//! Persistent because a forward pass runs a parallel step several times per layer (a
//! decode of SmolLM2 runs ~150): spawning threads per step (tens of µs each) would cost
//! more than the step. Workers spin briefly, then yield, then sleep on a condvar, so an
//! idle runner costs nothing and a busy one hands off in about a microsecond.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Spins (`spin_loop`) before yielding, and yields before sleeping.
const SPINS: u32 = 2_000;
const YIELDS: u32 = 2_000;

type Job = &'static (dyn Fn(usize) + Sync);

struct State {
    job: Option<Job>,
    /// No more workers may join the current job.
    closed: bool,
    sleepers: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    generation: AtomicU64,
    /// Workers running the current job (joined under the lock while it was open).
    active: AtomicUsize,
    quit: AtomicBool,
    panicked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A job panicked on some thread (a bug: the forward pass does not panic by design).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a forward-pass thread panicked")]
pub struct PoolPanicked;

/// `n` threads: the caller and `n - 1` workers.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Pool {
    /// A pool of `threads` threads (at least 1) in all, the caller included. Fails only if
    /// the OS refuses a thread.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                job: None,
                closed: true,
                sleepers: 0,
            }),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("den-model-{i}"))
                .spawn(move || worker(&shared, i))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads in all, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(0)` here and `f(i)` on each worker `i` that arrives before `f(0)` returns;
    /// returns when all of those calls have returned. See the module documentation for
    /// what `f` must be.
    pub fn run(&mut self, f: &(dyn Fn(usize) + Sync)) -> Result<(), PoolPanicked> {
        if self.workers.is_empty() {
            return catch_unwind(AssertUnwindSafe(|| f(0))).map_err(|_| PoolPanicked);
        }
        // SAFETY: a worker only calls the job after joining it (under the lock, while it is
        // open) and `active` counts it until its call has returned. This function closes
        // the job, waits for `active` to reach 0 and clears the job before returning; it
        // cannot unwind before that (the caller's part runs under catch_unwind). So `f`
        // outlives every use, and `&mut self` excludes concurrent runs.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        let s = &*self.shared;
        s.panicked.store(false, Ordering::Relaxed);
        {
            let mut st = s.lock();
            st.job = Some(job);
            st.closed = false;
            s.generation.fetch_add(1, Ordering::AcqRel);
            if st.sleepers > 0 {
                s.wake.notify_all();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        s.lock().closed = true;
        let mut spins = 0u32;
        while s.active.load(Ordering::Acquire) != 0 {
            backoff(&mut spins);
        }
        s.lock().job = None;
        if mine.is_err() || s.panicked.load(Ordering::Relaxed) {
            return Err(PoolPanicked);
        }
        Ok(())
    }
}

fn backoff(spins: &mut u32) {
    if *spins < SPINS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *spins = spins.saturating_add(1);
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            if spins < SPINS + YIELDS {
                backoff(&mut spins);
                continue;
            }
            let mut st = s.lock();
            st.sleepers += 1;
            while s.generation.load(Ordering::Acquire) == seen && !s.quit.load(Ordering::Acquire) {
                st = s.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            st.sleepers -= 1;
            spins = 0;
        }
        let job = {
            let st = s.lock();
            match st.job {
                Some(job) if !st.closed => {
                    s.active.fetch_add(1, Ordering::AcqRel);
                    Some(job)
                }
                _ => None,
            }
        };
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(|| job(index))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
            s.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Release);
        {
            let _st = self.shared.lock();
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A work-sharing loop: every item done exactly once, whoever joins.
    #[test]
    fn work_is_done_once_whoever_joins() {
        for n in [1, 2, 3] {
            let mut pool = Pool::new(n).unwrap();
            for round in 0..300 {
                let next = AtomicUsize::new(0);
                let done: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                let by: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|t| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(d) = done.get(i) else { break };
                        d.fetch_add(1, Ordering::Relaxed);
                        by[t].fetch_add(1, Ordering::Relaxed);
                        if round % 7 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
                .unwrap();
                assert!(done.iter().all(|d| d.load(Ordering::Relaxed) == 1));
                let total: usize = by.iter().map(|b| b.load(Ordering::Relaxed)).sum();
                assert_eq!(total, 64);
            }
        }
    }

    #[test]
    fn wakes_after_sleeping_and_reports_panics() {
        let mut pool = Pool::new(2).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The caller waits (here: spins until the worker arrived and ran) for a worker
        // that joined.
        let hit = AtomicUsize::new(0);
        pool.run(&|i| {
            hit.fetch_add(1, Ordering::Relaxed);
            if i == 0 {
                while hit.load(Ordering::Relaxed) < 2 {
                    std::thread::yield_now();
                }
            }
        })
        .unwrap();
        assert_eq!(hit.load(Ordering::Relaxed), 2);
        let arrived = AtomicBool::new(false);
        let r = pool.run(&|i| {
            if i == 1 {
                arrived.store(true, Ordering::Relaxed);
                panic!("worker bug");
            }
            while !arrived.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
        });
        assert_eq!(r, Err(PoolPanicked));
        assert!(pool.run(&|_| {}).is_ok());
    }
}
