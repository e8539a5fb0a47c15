use super::*;
use crate::meta::ListedEntry;
use crate::store::mem::MemStore;
use std::sync::atomic::Ordering;

/// `n` objects `d/k{i}` of `size` bytes in `store`, and their listing.
fn dir(store: &MemStore, n: usize, size: usize) -> Arc<DirListing> {
    let entries = (0..n)
        .map(|i| {
            let etag = store.put(&format!("d/k{i:03}"), vec![i as u8; size]);
            ListedEntry {
                name: format!("k{i:03}"),
                kind: EntryKind::File,
                size: size as u64,
                etag,
                mtime: None,
            }
        })
        .collect();
    Arc::new(DirListing {
        entries,
        fetched: Instant::now(),
        served_stale: Default::default(),
    })
}

fn prefetcher(
    store: &Arc<MemStore>,
    budget: u64,
    in_flight: usize,
) -> Arc<SmallPrefetch<MemStore>> {
    let c = ReadConfig {
        small_max_size: 1000,
        small_max_in_flight: in_flight,
        small_budget: Some(budget),
        ..ReadConfig::default()
    };
    SmallPrefetch::new(store.clone(), &c, MemoryBudget::new(1 << 20), None).unwrap()
}

/// Waits until no prefetch GET is in flight and none starts for a while
/// (a GET's end sends the next from a task of its own).
async fn settle(p: &SmallPrefetch<MemStore>) {
    let mut quiet = 0;
    for _ in 0..10_000 {
        if p.in_flight.load(Ordering::Relaxed) == 0 {
            quiet += 1;
            if quiet >= 20 {
                return;
            }
        } else {
            quiet = 0;
        }
        tokio::task::yield_now().await;
    }
    panic!("prefetch GETs did not end");
}

/// A scan fetches the directory's others up to the unread budget and
/// stops; each take frees room for the next; a taken object's bytes are
/// the object's, at the listed ETag; a second scan of the same listing
/// does nothing.
#[tokio::test]
async fn the_budget_stops_prefetch_and_takes_resume_it() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 10, 100);
    let p = prefetcher(&store, 300, 64);
    p.take("d/k000", &listing.entries[0].etag, 100);
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    assert_eq!(store.gets.load(Ordering::Relaxed), 3, "300 bytes of 100");
    assert_eq!((p.unread_bytes(), p.queued()), (300, 6));
    p.missed("d/k000", "d/", listing.clone(), None).await;
    assert_eq!(p.queued(), 6, "same listing: not queued again");
    let Taken::Prefetched(part) = p.take("d/k001", &listing.entries[1].etag, 100) else {
        panic!("k001 not prefetched");
    };
    assert_eq!(&part.bytes().unwrap().slice(0, 100)[..], &[1u8; 100][..]);
    settle(&p).await;
    assert_eq!(
        store.gets.load(Ordering::Relaxed),
        4,
        "one freed slot, one GET"
    );
    assert_eq!(p.unread_bytes(), 300);
}

/// Prefetch waiting at its bound with objects pushed and no sign of the
/// loader for [`SILENCE`] finds it silent: the callback gets the pushed
/// objects, and later pushes ask for a sign. A sign the kernel sends
/// frees a slot and keeps the asking; a sign of the loader's own ends it.
#[tokio::test]
async fn a_loader_with_no_sign_for_a_second_is_found_silent_until_it_sends_one() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 10, 100);
    let p = prefetcher(&store, 300, 64);
    let found = Arc::new(Mutex::new(Vec::new()));
    let f = found.clone();
    p.on_silent(move |objs| f.lock().unwrap().push(objs));
    let etag = |i: usize| listing.entries[i].etag.clone();
    p.take("d/k000", &etag(0), 100);
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    for i in 1..=3 {
        assert!(!p.delivered(&format!("d/k{i:03}"), &etag(i), 100, false));
    }
    settle(&p).await;
    assert!(found.lock().unwrap().is_empty(), "silent at once");
    // Anyone's stat before any sign is asked for is no sign.
    p.consumed("d/k001", Sign::Kernel);
    settle(&p).await;
    assert_eq!(store.gets.load(Ordering::Relaxed), 3, "a stat freed a slot");
    // The task that looks again after `SILENCE` finds it.
    tokio::time::sleep(SILENCE + Duration::from_millis(300)).await;
    settle(&p).await;
    let mut keys: Vec<String> = {
        let found = found.lock().unwrap();
        assert_eq!(found.len(), 1, "found silent other than once");
        found[0].iter().map(|(k, _, _)| k.clone()).collect()
    };
    keys.sort();
    assert_eq!(keys, ["d/k001", "d/k002", "d/k003"]);
    assert!(p.wants_read_signal() && p.awaits_sign("d/k001"));

    p.consumed("d/k001", Sign::Kernel);
    settle(&p).await;
    assert_eq!(store.gets.load(Ordering::Relaxed), 4, "no slot freed");
    assert!(p.wants_read_signal() && !p.awaits_sign("d/k001"));
    assert!(p.delivered("d/k004", &etag(4), 100, false), "no sign asked");

    // Python's `open`: fstat (a GETATTR, answered), then its ioctl.
    p.consumed("d/k002", Sign::Kernel);
    assert!(p.wants_read_signal());
    p.consumed("d/k002", Sign::Own);
    assert!(!p.wants_read_signal(), "an own sign kept the asking");
    assert!(!p.awaits_sign("d/k003"));
    // Nothing is forgiven for a loader that signs, and a later finding
    // asks again for all it lists.
    let inner = p.inner.lock().unwrap();
    assert!(inner.forgive_at.is_none());
    assert!(inner.placed.values().all(|o| o.asked == Asked::Not));
}

/// A pushed object holds its budget until the loader is seen at it;
/// seen before its push lands, the push frees it at once; a read of a
/// pushed object frees it too. Each freed slot sends the next GET.
#[tokio::test]
async fn pushed_objects_free_their_budget_whenever_the_loader_is_seen() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 10, 100);
    let p = prefetcher(&store, 300, 64);
    let etag = |i: usize| listing.entries[i].etag.clone();
    p.take("d/k000", &etag(0), 100);
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    let gets = || store.gets.load(Ordering::Relaxed);
    assert_eq!((gets(), p.unread_bytes()), (3, 300));

    // Pushed, then seen: held until seen.
    p.delivered("d/k001", &etag(1), 100, false);
    settle(&p).await;
    assert_eq!((gets(), p.unread_bytes()), (3, 300), "freed before seen");
    p.consumed("d/k001", Sign::Own);
    settle(&p).await;
    assert_eq!((gets(), p.unread_bytes()), (4, 300));

    // Seen while still held (its push under way), then pushed.
    p.consumed("d/k002", Sign::Own);
    p.delivered("d/k002", &etag(2), 100, false);
    settle(&p).await;
    assert_eq!((gets(), p.unread_bytes()), (5, 300), "early sight lost");

    // Pushed, then read (no ioctl first).
    p.delivered("d/k003", &etag(3), 100, false);
    assert!(matches!(p.take("d/k003", &etag(3), 100), Taken::Missed(_)));
    settle(&p).await;
    assert_eq!((gets(), p.unread_bytes()), (6, 300), "a read freed nothing");
    assert!(p.inner.lock().unwrap().held.values().all(|h| !h.seen));
}

/// The held objects' keys, sorted.
fn held_keys(p: &SmallPrefetch<MemStore>) -> Vec<String> {
    let inner = p.inner.lock().unwrap();
    let mut k: Vec<String> = inner.held.keys().cloned().collect();
    k.sort();
    k
}

/// Readers open their first objects of a directory at once: whichever
/// first read scans, and whether the others' first reads come before
/// or after that scan, no object opened in that race is fetched again
/// (its opener reads it), nor held unread; later first reads of the
/// round do not scan.
#[tokio::test]
async fn objects_opened_in_a_race_with_a_scan_are_not_fetched_again() {
    let ttl = Duration::from_secs(60);
    for in_flight in [1, 64] {
        // Three openers; the last one's first read scans first.
        let (p, listing) = opened_in_order(in_flight, &[1, 2, 0]).await;
        assert!(p.first_read("d/k000", "d/", None, ttl));
        p.missed("d/k000", "d/", listing.clone(), None).await;
        assert!(!p.first_read("d/k001", "d/", None, ttl));
        assert!(!p.first_read("d/k002", "d/", None, ttl));
        settle(&p).await;
        assert_eq!(held_keys(&p), ["d/k003", "d/k004", "d/k005"]);
        assert_eq!((p.unread_bytes(), p.queued()), (300, 0));

        // Two openers; the earlier one's first read scans first.
        let (p, listing) = opened_in_order(in_flight, &[1, 0]).await;
        assert!(p.first_read("d/k001", "d/", None, ttl));
        p.missed("d/k001", "d/", listing.clone(), None).await;
        assert!(!p.first_read("d/k000", "d/", None, ttl));
        settle(&p).await;
        assert_eq!(held_keys(&p), ["d/k002", "d/k003", "d/k004", "d/k005"]);
        assert_eq!(p.unread_bytes(), 400);

        // Both first reads before either scan; the later opener's scan
        // runs first and queues the earlier one's object.
        let (p, listing) = opened_in_order(in_flight, &[1, 0]).await;
        assert!(p.first_read("d/k001", "d/", None, ttl));
        assert!(p.first_read("d/k000", "d/", None, ttl));
        p.missed("d/k000", "d/", listing.clone(), None).await;
        p.missed("d/k001", "d/", listing.clone(), None).await;
        settle(&p).await;
        assert_eq!(held_keys(&p), ["d/k002", "d/k003", "d/k004", "d/k005"]);
        assert_eq!(p.unread_bytes(), 400);
    }
}

/// A prefetcher (`in_flight` GETs at once) over a fresh directory of six
/// 100-byte objects, of which `order` (indices) were opened, 2 ms apart,
/// with nothing prefetched; and the directory's listing.
async fn opened_in_order(
    in_flight: usize,
    order: &[usize],
) -> (Arc<SmallPrefetch<MemStore>>, Arc<DirListing>) {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 6, 100);
    let p = prefetcher(&store, 1000, in_flight);
    for &i in order {
        let taken = p.take(&format!("d/k{i:03}"), &listing.entries[i].etag, 100);
        assert!(matches!(taken, Taken::Missed(None)));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (p, listing)
}

/// An open of a queued object takes it out of the queue (its own read
/// fetches it, no prefetch GET follows); an object held at another ETag
/// is dropped, not given out.
#[tokio::test]
async fn queued_objects_leave_the_queue_and_changed_ones_are_dropped() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 5, 100);
    let p = prefetcher(&store, 1000, 1);
    p.take("d/k000", &listing.entries[0].etag, 100);
    p.missed("d/k000", "d/", listing.clone(), None).await;
    // One in flight (k001), k002..k004 queued.
    assert!(matches!(
        p.take("d/k003", &listing.entries[3].etag, 100),
        Taken::Missed(None)
    ));
    settle(&p).await;
    assert!(
        matches!(p.take("d/k001", "\"other\"", 100), Taken::Missed(None)),
        "changed ETag"
    );
    settle(&p).await;
    let fetched: Vec<String> = {
        let inner = p.inner.lock().unwrap();
        let mut k: Vec<String> = inner.held.keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(fetched, ["d/k002", "d/k004"], "k003 never fetched");
    assert_eq!(store.gets.load(Ordering::Relaxed), 3);
}

/// Objects held past UNREAD_TTL are dropped with their bytes; younger
/// ones stay.
#[tokio::test]
async fn unread_objects_expire() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 3, 100);
    let p = prefetcher(&store, 1000, 64);
    p.missed("d/k000", "d/", listing, None).await;
    settle(&p).await;
    let mut inner = p.inner.lock().unwrap();
    assert!(expire(&mut inner, Instant::now()).is_empty());
    let later = Instant::now() + UNREAD_TTL;
    assert_eq!(expire(&mut inner, later).len(), 3);
    assert_eq!((inner.unread, inner.held.len()), (0, 0));
}

/// Objects opened in a round are not fetched again by a later scan of
/// a new listing in that round; an object read from S3 again after it
/// was opened in the round starts the next round, which fetches them all.
#[tokio::test]
async fn a_read_again_starts_the_next_round() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 4, 100);
    let p = prefetcher(&store, 1000, 64);
    let etag = |i: usize| listing.entries[i].etag.clone();
    assert!(matches!(
        p.take("d/k000", &etag(0), 100),
        Taken::Missed(None)
    ));
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    for i in 1..4 {
        assert!(matches!(
            p.take(&format!("d/k{i:03}"), &etag(i), 100),
            Taken::Prefetched(_)
        ));
    }
    assert_eq!(store.gets.load(Ordering::Relaxed), 3);
    // A new listing of the same round: everything was opened, no GET.
    let relisted = Arc::new(DirListing {
        entries: listing.entries.clone(),
        fetched: Instant::now(),
        served_stale: Default::default(),
    });
    p.missed("d/k001", "d/", relisted.clone(), None).await;
    settle(&p).await;
    assert_eq!(store.gets.load(Ordering::Relaxed), 3);
    // k002 is read from S3 again: its earlier open was in this round.
    let Taken::Missed(Some(before)) = p.take("d/k002", &etag(2), 100) else {
        panic!("k002 was opened before");
    };
    p.missed("d/k002", "d/", relisted, Some(before)).await;
    settle(&p).await;
    assert_eq!(
        store.gets.load(Ordering::Relaxed),
        6,
        "k000, k001, k003 again"
    );
    assert_eq!(p.unread_bytes(), 300);
}

/// An unscanned directory may be scanned; after its scan, a miss of the
/// same round may not (its listing is younger than the TTL), while a
/// read again (next round) or a listing past the TTL may.
#[tokio::test]
async fn only_a_new_round_or_listing_may_scan_again() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 4, 100);
    let p = prefetcher(&store, 1000, 64);
    let ttl = Duration::from_secs(60);
    assert!(p.first_read("d/k000", "d/", None, ttl));
    let Taken::Missed(None) = p.take("d/k000", &listing.entries[0].etag, 100) else {
        panic!("k000 not opened before");
    };
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    assert!(
        !p.first_read("d/k001", "d/", None, ttl),
        "same round, fresh listing"
    );
    assert!(p.first_read("e/k000", "e/", None, ttl), "another directory");
    let Taken::Missed(Some(before)) = p.take("d/k000", &listing.entries[0].etag, 100) else {
        panic!("k000 was opened before");
    };
    assert!(
        p.first_read("d/k000", "d/", Some(before), ttl),
        "read again: next round"
    );
    assert!(
        p.first_read("d/k001", "d/", None, Duration::ZERO),
        "listing past its TTL"
    );
}

/// An object placed out of memory twice (fetched again by a later scan
/// before its first copy was opened) counts once, and nothing once it
/// is taken.
#[test]
fn a_key_placed_twice_counts_once() {
    let mut inner = Inner::default();
    let obj = |size, to| PlacedObject {
        etag: "e".into(),
        size,
        since: Instant::now(),
        to,
        asked: Asked::Not,
    };
    inner.place("d/a", obj(100, Placed::PageCache));
    inner.place("d/a", obj(100, Placed::PageCache));
    inner.place("d/b", obj(50, Placed::DataCache));
    assert_eq!((inner.placed_bytes, inner.pushed), (150, 1));
    inner.place("d/a", obj(100, Placed::DataCache));
    assert_eq!((inner.placed_bytes, inner.pushed), (150, 0));
    assert!(inner.unplace("d/a").is_some());
    assert!(inner.unplace("d/a").is_none());
    assert_eq!((inner.placed_bytes, inner.pushed), (50, 0));
}

/// A prefetch GET that fails (here: the object changed since its
/// listing, 412) gives its bytes back to the unread budget at once
/// instead of holding them until it expires.
#[tokio::test]
async fn a_failed_prefetch_holds_no_budget() {
    let store = Arc::new(MemStore::default());
    let listing = dir(&store, 3, 100);
    store.put("d/k002", vec![9u8; 100]);
    let p = prefetcher(&store, 1000, 64);
    p.take("d/k000", &listing.entries[0].etag, 100);
    p.missed("d/k000", "d/", listing.clone(), None).await;
    settle(&p).await;
    assert_eq!(p.unread_bytes(), 100, "only k001 is held");
    assert!(!p.inner.lock().unwrap().held.contains_key("d/k002"));
}
