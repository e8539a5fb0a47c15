//! When to send a hedged GET: a second request for the same bytes, sent
//! when the first has not answered by the time nearly all GETs have
//! ("hedged requests", Dean and Barroso, "The Tail at Scale", CACM 2013).
//!
//! The delay is the [`QUANTILE`] of the recent times to response headers,
//! so about one GET in twenty is hedged on a healthy server, and a request
//! the server holds (a slow first byte, a lost SYN) costs about that
//! quantile instead of its timeout. A budget keeps hedges under
//! [`MAX_RATIO`] of GETs whatever the latencies do: a server that slows
//! down as a whole does not get twice the requests.
//!
//! A hedge spends server capacity to cut a waiting reader's latency, so a
//! GET sent ahead of its reader (read-ahead, small-object prefetch) is
//! hedged only once a reader waits for it ([`Urgency`]): hedging GETs nobody
//! waits for only loads a busy server further (docs/SEMANTICS.md).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::telemetry::metrics as m;

/// Times to headers kept for the quantile, most recent first out.
const WINDOW: usize = 512;
/// The quantile is computed again after this many new samples.
const RECOMPUTE_EVERY: usize = 32;
/// Samples needed before hedging starts; until then [`MAX_DELAY`] applies.
const MIN_SAMPLES: usize = 64;
/// The quantile of the time to headers past which a GET is hedged: the
/// 95th percentile of "The Tail at Scale".
const QUANTILE: f64 = 0.95;
/// Shortest hedge delay: under it, scheduling noise alone would reach the
/// quantile on a loopback server.
const MIN_DELAY: Duration = Duration::from_millis(10);
/// Longest hedge delay: Amazon S3's guidance for latency-sensitive
/// applications is to retry a small GET after 2 s ("Performance guidelines
/// for Amazon S3", timeouts and retries).
const MAX_DELAY: Duration = Duration::from_secs(2);
/// How often a request waiting for its answer looks at the delay again.
const RECHECK: Duration = Duration::from_millis(100);
/// At most this share of GETs is hedged, over time.
const MAX_RATIO: f64 = 0.1;
/// Hedges that may be sent in a burst, once the budget is full.
const MAX_BURST: f64 = 20.0;

/// Hedge delay and budget of one bucket's GETs. Shared by all of them.
#[derive(Debug)]
pub(super) struct Hedge {
    /// The operation, for the metrics (`GET`, `LIST`).
    op: &'static str,
    samples: Mutex<Samples>,
    /// The current delay, microseconds.
    delay_us: AtomicU64,
    /// Hedges that may be sent now, in millionths (a token bucket filled by
    /// [`MAX_RATIO`] per GET).
    budget: AtomicU64,
}

#[derive(Debug)]
struct Samples {
    /// Times to headers, microseconds; a ring of [`WINDOW`] once full.
    ring: Vec<u32>,
    next: usize,
    since_recompute: usize,
}

const MICRO: f64 = 1e6;

/// Whether a reader waits for a GET's bytes: a GET sent ahead of its reader
/// starts not waited for and is marked when a read has to wait for it. Only
/// then may it be hedged. Cheap to clone (the clones share the mark).
#[derive(Clone, Debug, Default)]
pub struct Urgency(Arc<UrgencyInner>);

#[derive(Debug, Default)]
struct UrgencyInner {
    waited: AtomicBool,
    marked: tokio::sync::Notify,
}

impl Urgency {
    /// For a GET sent ahead of any reader: not waited for yet.
    pub fn ahead() -> Self {
        Self::default()
    }

    /// For a GET a reader waits for from the start.
    pub fn now() -> Self {
        let u = Self::default();
        u.mark();
        u
    }

    /// Marks the GET as waited for (idempotent).
    pub fn mark(&self) {
        if !self.0.waited.swap(true, Ordering::AcqRel) {
            self.0.marked.notify_waiters();
        }
    }

    /// Whether a reader waits for the GET.
    pub fn is_waited(&self) -> bool {
        self.0.waited.load(Ordering::Acquire)
    }

    /// Resolves once a reader waits for the GET.
    pub async fn waited(&self) {
        loop {
            let marked = self.0.marked.notified();
            tokio::pin!(marked);
            // Registered before the check, so a mark between the two wakes it.
            marked.as_mut().enable();
            if self.is_waited() {
                return;
            }
            marked.await;
        }
    }
}

impl Hedge {
    /// The hedging of `op` requests (a metrics label).
    pub(super) fn new(op: &'static str) -> Self {
        Self {
            op,
            samples: Mutex::new(Samples {
                ring: Vec::with_capacity(WINDOW),
                next: 0,
                since_recompute: 0,
            }),
            delay_us: AtomicU64::new(MAX_DELAY.as_micros() as u64),
            budget: AtomicU64::new((MAX_BURST * MICRO) as u64),
        }
    }

    /// How long a GET waits for its headers, or a body for its next byte,
    /// before it is hedged.
    pub(super) fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us.load(Ordering::Relaxed))
    }

    /// Credits the hedge budget with one GET's share.
    pub(super) fn credit(&self) {
        let add = (MAX_RATIO * MICRO) as u64;
        let cap = (MAX_BURST * MICRO) as u64;
        let _ = self
            .budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((b + add).min(cap))
            });
    }

    /// Takes one hedge from the budget; `false` when it is spent.
    pub(super) fn try_spend(&self) -> bool {
        let one = MICRO as u64;
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(one))
            .is_ok()
    }

    /// Runs `send()`, and once more when the first has not finished after
    /// the delay, a reader waits for it (`urgency`: `None` counts as waited
    /// for) and the budget allows: the first success is returned, the other
    /// request dropped. Either one failing waits for the other; both failing
    /// returns the later failure.
    pub(super) async fn run<T, E, F, Fut>(&self, urgency: Option<&Urgency>, send: F) -> Result<T, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        let first = send();
        tokio::pin!(first);
        self.credit();
        // The delay is looked at again while the request waits: one sent
        // before the server's latencies were known waits for what they turn
        // out to be, not for the initial MAX_DELAY.
        loop {
            let wait = self.delay().saturating_sub(started.elapsed());
            if wait.is_zero() {
                break;
            }
            match tokio::time::timeout(wait.min(RECHECK), &mut first).await {
                Ok(Ok(a)) => {
                    self.record(started.elapsed());
                    return Ok(a);
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {}
            }
        }
        if let Some(u) = urgency.filter(|u| !u.is_waited()) {
            tokio::select! {
                r = &mut first => {
                    if r.is_ok() {
                        self.record(started.elapsed());
                    }
                    return r;
                }
                () = u.waited() => {}
            }
        }
        if !self.try_spend() {
            return first.await;
        }
        let second_started = Instant::now();
        // Boxed: allocated only when a hedge is sent, instead of making
        // every GET's future larger by a request.
        let mut second = Box::pin(send());
        tokio::select! {
            r = &mut first => match r {
                Ok(a) => {
                    m::s3_hedge(self.op, m::HEDGE_FIRST_WON);
                    self.record(started.elapsed());
                    Ok(a)
                }
                Err(_) => second.await.inspect(|_| m::s3_hedge(self.op, m::HEDGE_WON)),
            },
            r = &mut second => match r {
                Ok(a) => {
                    m::s3_hedge(self.op, m::HEDGE_WON);
                    self.record(second_started.elapsed());
                    self.record(started.elapsed());
                    Ok(a)
                }
                // The first may still answer soundly: a hedge's error (a
                // 404 from a lagging replica, a reset) is not the answer.
                Err(_) => {
                    m::s3_hedge(self.op, m::HEDGE_FAILED);
                    first.await
                }
            },
        }
    }

    /// Records how long a GET took to its headers (or, for one that lost to
    /// its hedge, how long it had waited: a lower bound, which keeps a
    /// window of hedged GETs from showing only the fast ones).
    pub(super) fn record(&self, took: Duration) {
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if s.ring.len() < WINDOW {
            s.ring.push(us);
        } else {
            let i = s.next;
            s.ring[i] = us;
        }
        s.next = (s.next + 1) % WINDOW;
        s.since_recompute += 1;
        if s.ring.len() < MIN_SAMPLES || s.since_recompute < RECOMPUTE_EVERY {
            return;
        }
        s.since_recompute = 0;
        let mut sorted = s.ring.clone();
        drop(s);
        let rank = ((sorted.len() - 1) as f64 * QUANTILE).round() as usize;
        let (_, q, _) = sorted.select_nth_unstable(rank);
        let delay = Duration::from_micros(u64::from(*q)).clamp(MIN_DELAY, MAX_DELAY);
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        m::s3_hedge_delay(self.op, delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_the_longest_delay_until_it_has_samples() {
        let h = Hedge::new("GET");
        for _ in 0..MIN_SAMPLES - 1 {
            h.record(Duration::from_millis(20));
        }
        assert_eq!(h.delay(), MAX_DELAY);
    }

    #[test]
    fn delay_is_the_95th_percentile_of_recent_samples() {
        let h = Hedge::new("GET");
        // 1..=512 ms: the 95th percentile is ~487 ms.
        for ms in 1..=WINDOW as u64 {
            h.record(Duration::from_millis(ms));
        }
        let d = h.delay().as_millis();
        assert!((480..=495).contains(&d), "{d} ms");
        // A window of fast answers replaces it.
        for _ in 0..WINDOW {
            h.record(Duration::from_millis(30));
        }
        assert_eq!(h.delay(), Duration::from_millis(30));
    }

    #[test]
    fn delay_stays_within_its_bounds() {
        let h = Hedge::new("GET");
        for _ in 0..WINDOW {
            h.record(Duration::from_micros(200));
        }
        assert_eq!(h.delay(), MIN_DELAY);
        for _ in 0..WINDOW {
            h.record(Duration::from_secs(9));
        }
        assert_eq!(h.delay(), MAX_DELAY);
    }

    /// A hedge with a 10 ms delay, and a `send` whose first request answers
    /// `1` after 300 ms and every later one `2` at once; counts the sends.
    fn slow_first() -> (Hedge, Arc<AtomicU64>, impl Fn() -> BoxedAnswer) {
        let h = Hedge::new("GET");
        for _ in 0..WINDOW {
            h.record(Duration::from_millis(1));
        }
        assert_eq!(h.delay(), MIN_DELAY);
        let sent = Arc::new(AtomicU64::new(0));
        let n = sent.clone();
        let send = move || -> BoxedAnswer {
            let first = n.fetch_add(1, Ordering::SeqCst) == 0;
            Box::pin(async move {
                if first {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok(1)
                } else {
                    Ok(2)
                }
            })
        };
        (h, sent, send)
    }

    type BoxedAnswer = std::pin::Pin<Box<dyn Future<Output = Result<u32, ()>> + Send>>;

    #[tokio::test]
    async fn a_late_get_a_reader_waits_for_is_hedged() {
        let (h, sent, send) = slow_first();
        assert_eq!(h.run(None, &send).await, Ok(2));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        let (h, sent, send) = slow_first();
        assert_eq!(h.run(Some(&Urgency::now()), &send).await, Ok(2));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_get_ahead_of_its_reader_is_not_hedged() {
        let (h, sent, send) = slow_first();
        let started = Instant::now();
        assert_eq!(h.run(Some(&Urgency::ahead()), &send).await, Ok(1));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_get_ahead_is_hedged_once_a_reader_waits() {
        let (h, sent, send) = slow_first();
        let urgency = Urgency::ahead();
        let u = urgency.clone();
        let waits = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            u.mark();
        });
        let started = Instant::now();
        assert_eq!(h.run(Some(&urgency), &send).await, Ok(2));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_millis(300),
            "{took:?}"
        );
        waits.await.unwrap();
    }

    #[test]
    fn hedges_stay_under_a_tenth_of_gets() {
        let h = Hedge::new("GET");
        while h.try_spend() {}
        let mut hedged = 0;
        for _ in 0..1000 {
            h.credit();
            if h.try_spend() {
                hedged += 1;
            }
        }
        assert!(
            (99..=100).contains(&hedged),
            "{hedged} hedges per 1000 GETs"
        );
    }
}
