//! Which FUSE session threads wait on /dev/fuse: one at a time.
//!
//! The kernel wakes the session threads blocked in `read(/dev/fuse)` in
//! turn, the one that has waited longest first (an exclusive wait queue,
//! `fuse_dev_do_read` in fs/fuse/dev.c). With several threads waiting, every
//! request therefore wakes a sleeping thread, often on another CPU, even when
//! the thread that answered the last request is about to read again; for a
//! loader that opens and reads thousands of small files, those wakeups are
//! most of a request's cost. So after its request a thread that sees another
//! one waiting parks here instead of reading, and the one waiting thread
//! finds requests that arrived meanwhile queued, with no wakeup.
//!
//! A parked thread goes back to reading when a request's handler says it
//! may block ([`Turn::may_block`]) while no other thread waits, or after
//! [`PATIENCE`] at the latest: a handler that blocks without saying so
//! delays the requests behind it by at most that long, and every thread
//! sees the end of the session (ENODEV from its read) within it. A thread
//! whose handler panics ends and is not counted; one that fuser's loop ends
//! on another read error still is (every other thread then parks after each
//! request, up to [`PATIENCE`]), but such an error ends the session anyway.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest a spare session thread stays parked before it reads again.
/// Bounds the delay behind a handler that blocks unannounced, and how long
/// an unmount waits for the spare threads to see the session end.
pub const PATIENCE: Duration = Duration::from_millis(100);

/// The session threads' turns at reading /dev/fuse. Shared by all of them.
pub struct Turns {
    state: Mutex<State>,
    wake: Condvar,
    patience: Duration,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct State {
    /// Threads between two requests: reading /dev/fuse, or about to.
    reading: usize,
    /// Threads parked here.
    parked: usize,
    /// Parked threads asked to read again and not yet gone.
    wanted: usize,
}

/// One request's hold on its thread, from the handler's start to its end.
/// Dropped at the end of the handler: the thread then reads the next
/// request, or parks when another thread is reading.
pub struct Turn<'a> {
    turns: &'a Turns,
}

impl Turns {
    /// Turns for `threads` session threads, all of them reading at first,
    /// parked at most `patience` at a time.
    pub fn new(threads: usize, patience: Duration) -> Self {
        Self {
            state: Mutex::new(State {
                reading: threads,
                ..State::default()
            }),
            wake: Condvar::new(),
            patience,
        }
    }

    /// Called by a session thread as it starts on a request.
    pub fn take(&self) -> Turn<'_> {
        let mut s = self.state.lock().unwrap();
        s.reading = s.reading.saturating_sub(1);
        Turn { turns: self }
    }

    /// (reading, parked, wanted).
    #[cfg(test)]
    fn snapshot(&self) -> (usize, usize, usize) {
        let s = self.state.lock().unwrap();
        (s.reading, s.parked, s.wanted)
    }
}

impl Turn<'_> {
    /// The handler is about to wait (a write to local disk, say): when no
    /// other thread is reading, one parked thread goes back to reading so
    /// that the requests behind this one are not held up.
    pub fn may_block(&self) {
        let t = self.turns;
        let mut s = t.state.lock().unwrap();
        if s.reading == 0 && s.parked > s.wanted {
            s.wanted += 1;
            t.wake.notify_one();
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // A handler that panics ends its thread (fuser does not catch it):
        // counted as reading, the dead thread would keep every other one
        // parked after each request.
        if std::thread::panicking() {
            return;
        }
        let t = self.turns;
        let mut s = t.state.lock().unwrap();
        if s.reading > 0 {
            s.parked += 1;
            let deadline = Instant::now() + t.patience;
            loop {
                if s.wanted > 0 {
                    s.wanted -= 1;
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                s = t.wake.wait_timeout(s, deadline - now).unwrap().0;
            }
            s.parked -= 1;
        }
        s.reading += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    /// Waits until `turns` shows `parked` parked threads (10 s at most).
    fn until_parked(turns: &Turns, parked: usize) {
        let end = Instant::now() + Duration::from_secs(10);
        while turns.snapshot().1 != parked {
            assert!(
                Instant::now() < end,
                "never {parked} parked: {:?}",
                turns.snapshot()
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A request on a thread of its own: takes a turn and ends it. Returns
    /// how long the end of the turn (the park, if any) took.
    fn request_on_thread(turns: &Arc<Turns>) -> thread::JoinHandle<Duration> {
        let turns = turns.clone();
        thread::spawn(move || {
            let turn = turns.take();
            let t0 = Instant::now();
            drop(turn);
            t0.elapsed()
        })
    }

    /// A request on this thread, the only one reading: its turn ends at
    /// once, without parking.
    fn alone_request_does_not_park(turns: &Turns) {
        let t0 = Instant::now();
        drop(turns.take());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(turns.snapshot(), (1, 0, 0));
    }

    #[test]
    fn a_lone_thread_never_parks() {
        let turns = Turns::new(1, Duration::from_secs(60));
        for _ in 0..3 {
            alone_request_does_not_park(&turns);
        }
    }

    #[test]
    fn a_thread_parks_while_another_reads_and_leaves_after_its_patience() {
        let turns = Arc::new(Turns::new(2, Duration::from_millis(200)));
        // The other thread reads the whole time; this one's request ends.
        let waited = request_on_thread(&turns).join().unwrap();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert_eq!(turns.snapshot(), (2, 0, 0));
    }

    #[test]
    fn a_handler_that_may_block_sends_a_parked_thread_to_read() {
        let turns = Arc::new(Turns::new(2, Duration::from_secs(20)));
        // Thread B's request ends while A still reads: B parks.
        let b = request_on_thread(&turns);
        until_parked(&turns, 1);
        // A takes a request that may block: nobody else reads, so B goes.
        let a = turns.take();
        assert_eq!(turns.snapshot(), (0, 1, 0));
        a.may_block();
        let waited = b.join().unwrap();
        assert!(
            waited < Duration::from_secs(10),
            "woken, not timed out: {waited:?}"
        );
        assert_eq!(turns.snapshot(), (1, 0, 0));
        // B reads now: a second may_block wakes nobody.
        a.may_block();
        assert_eq!(turns.snapshot(), (1, 0, 0));
        // Ending A's turn would park it for its patience.
        std::mem::forget(a);
    }

    #[test]
    fn may_block_wakes_nobody_while_another_thread_reads() {
        let turns = Arc::new(Turns::new(3, Duration::from_millis(300)));
        // C parks (A and B read); then A takes a request: B still reads.
        let c = request_on_thread(&turns);
        until_parked(&turns, 1);
        let a = turns.take();
        a.may_block();
        let waited = c.join().unwrap();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert_eq!(turns.snapshot(), (2, 0, 0));
        drop(a);
    }

    #[test]
    fn a_thread_whose_handler_panics_is_not_counted_as_reading() {
        let turns = Arc::new(Turns::new(2, Duration::from_secs(20)));
        let t = turns.clone();
        let died = thread::spawn(move || {
            let _turn = t.take();
            panic!("handler panics");
        })
        .join();
        assert!(died.is_err());
        assert_eq!(turns.snapshot(), (1, 0, 0));
        // The one thread left reads alone: its turns never park.
        alone_request_does_not_park(&turns);
    }

    #[test]
    fn many_threads_never_lose_count() {
        let turns = Arc::new(Turns::new(4, Duration::from_millis(5)));
        let workers: Vec<_> = (0..4)
            .map(|i| {
                let turns = turns.clone();
                thread::spawn(move || {
                    for n in 0..200 {
                        let turn = turns.take();
                        if (n + i) % 7 == 0 {
                            turn.may_block();
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(turns.snapshot(), (4, 0, 0));
    }
}
