//! The device thread's job queue: a locked deque and the thread's park token. The actor
//! pushes (a short critical section, then an unpark: a futex wake only when the thread
//! sleeps); the device thread pops everything that is there before each step and parks
//! when it has nothing to do. `std::sync::mpsc` did the same with a waker list behind a
//! second lock, which the two threads contended for on every job (its `lock_contended`
//! showed in `perf` of `den-agent-bench --latency`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use super::Job;

struct Shared {
    state: Mutex<State>,
    /// The thread that pops, once it has asked for a job.
    consumer: OnceLock<Thread>,
    /// Bumped after every push and at the close, so an idle consumer can watch for work
    /// without taking the lock.
    pushes: AtomicU64,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// The sender is gone: nothing more will come.
    closed: bool,
    /// The device thread is gone: nothing more is taken.
    gone: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves a consistent deque.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        self.pushes.fetch_add(1, Ordering::Release);
        if let Some(t) = self.consumer.get() {
            t.unpark();
        }
    }
}

/// The actor's end; dropping it closes the queue.
pub(super) struct JobSender(Arc<Shared>);

/// The device thread's end.
pub(super) struct JobReceiver {
    shared: Arc<Shared>,
    /// How long it polls `pushes` before it parks (`--idle-spin`).
    idle_spin: Duration,
}

pub(super) fn job_queue(idle_spin: Duration) -> (JobSender, JobReceiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        consumer: OnceLock::new(),
        pushes: AtomicU64::new(0),
    });
    (
        JobSender(Arc::clone(&shared)),
        JobReceiver { shared, idle_spin },
    )
}

impl JobSender {
    /// Queues `job`; false when the device thread is gone.
    pub(super) fn send(&self, job: Job) -> bool {
        {
            let mut state = self.0.lock();
            if state.gone {
                return false;
            }
            state.jobs.push_back(job);
        }
        self.0.wake();
        true
    }
}

impl Drop for JobSender {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.wake();
    }
}

/// What `try_recv` found.
pub(super) enum Polled {
    Job(Job),
    Empty,
    Closed,
}

impl JobReceiver {
    /// The next job, waiting for one; `None` once the queue is closed and empty.
    pub(super) fn recv(&self) -> Option<Job> {
        // Registered before the first look at the deque, so a push after that look
        // finds a thread to unpark (and an unpark before `park` makes it return).
        self.shared.consumer.get_or_init(std::thread::current);
        let mut spun = false;
        loop {
            let seen = self.shared.pushes.load(Ordering::Acquire);
            match self.try_recv() {
                Polled::Job(job) => return Some(job),
                Polled::Closed => return None,
                Polled::Empty if !spun && !self.idle_spin.is_zero() => {
                    spun = true;
                    self.spin_while_idle(seen);
                }
                Polled::Empty => std::thread::park(),
            }
        }
    }

    /// Watches for a push for up to the queue's `idle_spin` before the thread parks
    /// (why: [`crate::worker::DEFAULT_IDLE_SPIN`]). The unpark that came with a push
    /// seen here stays pending, so the `park` after the next empty look returns at once.
    fn spin_while_idle(&self, seen: u64) {
        let until = Instant::now() + self.idle_spin;
        loop {
            for _ in 0..64 {
                if self.shared.pushes.load(Ordering::Acquire) != seen {
                    return;
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= until {
                return;
            }
        }
    }

    pub(super) fn try_recv(&self) -> Polled {
        let mut state = self.shared.lock();
        match state.jobs.pop_front() {
            Some(job) => Polled::Job(job),
            None if state.closed => Polled::Closed,
            None => Polled::Empty,
        }
    }
}

impl Drop for JobReceiver {
    fn drop(&mut self) {
        // Jobs still queued are dropped with it: their oneshot replies say so.
        let mut state = self.shared.lock();
        state.gone = true;
        state.jobs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    type Reply = oneshot::Receiver<Result<Vec<(crate::tiers::ChunkMeta, bytes::Bytes)>, String>>;

    fn capture(job: u64) -> (Job, Reply) {
        let (reply, rx) = oneshot::channel();
        let job = Job::Capture {
            job,
            pages: Vec::new(),
            chunks: Vec::new(),
            reply,
        };
        (job, rx)
    }

    fn id(job: Option<Job>) -> Option<u64> {
        match job {
            Some(Job::Capture { job, .. }) => Some(job),
            _ => None,
        }
    }

    /// Jobs come out in order, across threads, and what was queued before the sender went
    /// away still comes out before the end: whether the idle consumer parks at once,
    /// polls a little, or polls longer than the producer's pauses (its pushes and the
    /// close are then seen while it polls, and the unparks they left are spent later).
    #[test]
    fn jobs_arrive_in_order_then_the_close() {
        for spin in [0, 200, 10_000].map(Duration::from_micros) {
            let (tx, rx) = job_queue(spin);
            let consumer = std::thread::spawn(move || {
                let mut seen = Vec::new();
                while let Some(job) = id(rx.recv()) {
                    seen.push(job);
                }
                seen
            });
            let mut replies = Vec::new();
            for i in 0..1000 {
                let (job, reply) = capture(i);
                assert!(tx.send(job));
                replies.push(reply);
                if i % 100 == 0 {
                    // Long enough for the consumer to run dry and poll or park.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            drop(tx);
            assert_eq!(
                consumer.join().unwrap(),
                (0..1000).collect::<Vec<_>>(),
                "idle spin {spin:?}"
            );
        }
    }

    /// Once the device thread is gone, `send` says so, and queued jobs are dropped (their
    /// waiters hear that).
    #[test]
    fn a_gone_receiver_refuses_jobs_and_drops_the_queued_ones() {
        let (tx, rx) = job_queue(Duration::from_micros(200));
        let (job, _first) = capture(1);
        assert!(tx.send(job));
        assert!(matches!(rx.try_recv(), Polled::Job(_)));
        let (job, mut waiting) = capture(2);
        assert!(tx.send(job));
        assert!(matches!(
            waiting.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        drop(rx);
        assert!(
            matches!(
                waiting.try_recv(),
                Err(oneshot::error::TryRecvError::Closed)
            ),
            "the queued job's reply was dropped"
        );
        let (job, _reply) = capture(3);
        assert!(!tx.send(job));
    }
}
