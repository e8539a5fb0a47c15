//! Blocks being fetched from S3 now, shared by every read that needs them:
//! two read-ahead parts that meet inside a block, or several readers of one
//! cold file, send one GET for each block, not one each.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

use super::PieceKey;
use crate::store::{StoreError, Urgency};

/// A block's outcome once its fetch ended; `None` until then.
type Outcome = Option<Result<Bytes, StoreError>>;

/// A block in flight: where its outcome comes, and the urgency of its GET.
#[derive(Clone)]
pub(super) struct Flight {
    outcome: watch::Receiver<Outcome>,
    urgency: Urgency,
}

/// The blocks in flight, each with the outcome its fetch will send.
#[derive(Default)]
pub(super) struct Flights {
    table: Mutex<HashMap<PieceKey, Flight>>,
}

/// How a read gets one block it lacks.
pub(super) enum Claim {
    /// This read fetches it (and hands it to the reads that wait).
    Mine,
    /// Another read fetches it: wait for its outcome ([`wait`]).
    Wait(Flight),
}

/// The blocks one read fetches itself. Dropped before it handed each one
/// over (the read failed or was cancelled), those blocks leave the table,
/// and the reads waiting for them fetch them themselves.
pub(super) struct Fetching<'a> {
    flights: &'a Flights,
    senders: HashMap<PieceKey, watch::Sender<Outcome>>,
}

impl Flights {
    /// Claims each of `keys` for a read whose GETs carry `urgency`, in
    /// order: [`Claim::Mine`] for those nobody fetches now, [`Claim::Wait`]
    /// for the others.
    pub fn claim(&self, keys: &[PieceKey], urgency: &Urgency) -> (Fetching<'_>, Vec<Claim>) {
        let mut table = self.table.lock().unwrap();
        let mut senders = HashMap::new();
        let claims = keys
            .iter()
            .map(|k| match table.get(k) {
                Some(f) => Claim::Wait(f.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    let flight = Flight {
                        outcome: rx,
                        urgency: urgency.clone(),
                    };
                    table.insert(*k, flight);
                    senders.insert(*k, tx);
                    Claim::Mine
                }
            })
            .collect();
        (
            Fetching {
                flights: self,
                senders,
            },
            claims,
        )
    }

    /// Blocks in flight now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().unwrap().len()
    }
}

impl Fetching<'_> {
    /// Hands `key`'s outcome to the reads waiting for it; the block leaves
    /// the table (a later read finds it in the cache, or fetches it again
    /// after a failure).
    pub fn done(&mut self, key: PieceKey, outcome: Result<Bytes, StoreError>) {
        if let Some(tx) = self.senders.remove(&key) {
            self.flights.table.lock().unwrap().remove(&key);
            let _ = tx.send(Some(outcome));
        }
    }
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        let mut table = self.flights.table.lock().unwrap();
        for k in self.senders.keys() {
            table.remove(k);
        }
        // The senders drop with `self`: their waiters see no outcome.
    }
}

/// Waits for another read's fetch of a block: its outcome, or `None` when
/// that read ended before it had the block (this read fetches it then).
/// Once a reader waits on this read (`urgency`), so it does on that GET:
/// a read-ahead GET that a reader now needs is marked waited for.
pub(super) async fn wait(flight: Flight, urgency: &Urgency) -> Outcome {
    let Flight {
        outcome: mut rx,
        urgency: theirs,
    } = flight;
    let mut marked = theirs.is_waited();
    loop {
        if let Some(o) = rx.borrow_and_update().clone() {
            return Some(o);
        }
        if marked {
            if rx.changed().await.is_err() {
                return rx.borrow().clone();
            }
            continue;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                return rx.borrow().clone();
            },
            () = urgency.waited() => {
                theirs.mark();
                marked = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ObjectId;

    fn key(idx: u64) -> PieceKey {
        PieceKey {
            obj: ObjectId([0; 16]),
            idx,
        }
    }

    #[tokio::test]
    async fn a_block_in_flight_is_waited_for_and_a_dropped_fetch_hands_it_back() {
        let f = Flights::default();
        let ahead = Urgency::ahead();
        let (mut mine, claims) = f.claim(&[key(1), key(2)], &ahead);
        assert!(claims.iter().all(|c| matches!(c, Claim::Mine)));
        let (_other, claims) = f.claim(&[key(2), key(3)], &ahead);
        let Claim::Wait(flight) = &claims[0] else {
            panic!("block 2 is in flight")
        };
        assert!(matches!(claims[1], Claim::Mine));
        let waiter = tokio::spawn({
            let flight = flight.clone();
            async move { wait(flight, &Urgency::ahead()).await }
        });
        mine.done(key(2), Ok(Bytes::from_static(b"two")));
        assert_eq!(waiter.await.unwrap().unwrap().unwrap(), "two");
        // Block 1 was never handed over: dropping the fetch frees it.
        let (_third, claims) = f.claim(&[key(1)], &ahead);
        let Claim::Wait(flight1) = &claims[0] else {
            panic!("block 1 is still in flight")
        };
        let waiter = tokio::spawn({
            let flight1 = flight1.clone();
            async move { wait(flight1, &Urgency::ahead()).await }
        });
        drop(mine);
        assert!(waiter.await.unwrap().is_none());
        // Only block 3, the second read's, is in flight now.
        assert_eq!(f.len(), 1);
    }

    #[tokio::test]
    async fn a_reader_waiting_on_a_read_ahead_block_marks_its_get_waited_for() {
        let f = Flights::default();
        let ahead = Urgency::ahead();
        let (mut fetch, _) = f.claim(&[key(7)], &ahead);
        let (_w, claims) = f.claim(&[key(7)], &Urgency::now());
        let Claim::Wait(flight) = claims.into_iter().next().unwrap() else {
            panic!("block 7 is in flight")
        };
        let reader = Urgency::ahead();
        let waiter = tokio::spawn({
            let reader = reader.clone();
            async move { wait(flight, &reader).await }
        });
        tokio::task::yield_now().await;
        assert!(!ahead.is_waited(), "nobody waits on the read-ahead yet");
        reader.mark();
        tokio::time::timeout(std::time::Duration::from_secs(5), ahead.waited())
            .await
            .expect("the read-ahead GET is marked once its reader waits");
        fetch.done(key(7), Ok(Bytes::from_static(b"seven")));
        assert_eq!(waiter.await.unwrap().unwrap().unwrap(), "seven");
    }
}
