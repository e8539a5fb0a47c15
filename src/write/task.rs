//! The upload task of one staged file (`Writes::run`): when an upload is
//! due, which parts a file still being written may send early, the
//! multipart upload or single PUT, and the hand-over to S3.

use super::*;

/// What an upload task does next.
enum Step {
    /// Stop; abort this multipart upload, if any.
    Exit(Option<Mpu>),
    /// Send these parts (number, offset, length, version) while the file is
    /// still being written.
    Early(String, Vec<PartJob>),
    Sleep(Instant),
    Upload(String, u64, u64),
    HandOver,
}

/// Name endings and beginnings of temporary files (editors, downloaders,
/// Python's `tempfile`, the temp-file-then-rename save): their parts are not
/// sent while they are written, since they are usually renamed before they
/// are closed for good, and parts sent under the old name would be sent
/// again under the new one.
const TEMP_SUFFIXES: &[&str] = &[".tmp", ".temp", ".part", ".partial", "~"];
const TEMP_PREFIXES: &[&str] = &["tmp", ".tmp", ".~"];

/// Whether the file at `key` may send parts while it is written.
pub(super) fn early_ok(key: &str) -> bool {
    let name = key.rsplit('/').next().unwrap_or(key);
    !TEMP_SUFFIXES.iter().any(|s| name.ends_with(s))
        && !TEMP_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A part to send: number, offset, length, and the version of its bytes.
type PartJob = (u32, u64, u64, u64);

/// Marks the parts holding bytes `[off, end)` as changed at `st.version`.
pub(super) fn mark_written(first: u64, st: &mut State, off: u64, end: u64) {
    if end <= off {
        return;
    }
    let (mut n, mut start, _) = upload::part_at(first, off);
    while start < end {
        let i = (n - 1) as usize;
        if st.part_written.len() <= i {
            st.part_written.resize(i + 1, 0);
        }
        st.part_written[i] = st.version;
        start += upload::part_size(first, n);
        n += 1;
    }
}

/// The parts of `st`'s bytes the multipart upload under way does not hold
/// as they are now. `full_only`: only parts that end within the file (a
/// writer still writing its last part).
fn stale_parts(first: u64, st: &State, full_only: bool) -> Vec<PartJob> {
    let mut out = Vec::new();
    let (mut off, mut n) = (0u64, 1u32);
    while off < st.size && n <= crate::store::MAX_PARTS {
        let plen = upload::part_size(first, n);
        let len = plen.min(st.size - off);
        if full_only && len < plen {
            break;
        }
        let written = st.part_written.get(n as usize - 1).copied().unwrap_or(0);
        let sent = st.mpu.as_ref().and_then(|m| m.parts.get(&n));
        if !sent.is_some_and(|p| p.written == written && p.len == len) {
            out.push((n, off, len, written));
        }
        off += len;
        n += 1;
    }
    out
}

impl<S: ObjectStore + WriteStore> Writes<S> {
    /// Starts `f`'s upload task (`st` is its state, locked) unless one
    /// runs or the file is gone.
    pub(super) fn ensure_task(self: &Arc<Self>, f: &Arc<Staged>, st: &mut State) {
        if st.task || st.gone {
            return;
        }
        st.task = true;
        let (this, f) = (self.clone(), f.clone());
        self.rt.spawn(async move { this.run(f).await });
    }

    /// The upload task of one staged file: waits until an upload is due,
    /// uploads, and once S3 holds the last version and no writer is open,
    /// hands the file over to S3 (out of the overlay and staging).
    async fn run(self: Arc<Self>, f: Arc<Staged>) {
        loop {
            let wake = f.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let step = {
                let mut st = f.st.lock().unwrap();
                let now = Instant::now();
                let urgent = st.urgent > st.uploaded;
                let first = self.up.part_size;
                if st.gone {
                    st.task = false;
                    Step::Exit(st.mpu.take())
                } else if st.uploaded >= st.version && st.writers == 0 {
                    Step::HandOver
                } else if urgent || (st.writers == 0 && st.ready_at.is_some_and(|t| t <= now)) {
                    Step::Upload(st.key.clone(), st.version, st.size)
                } else if st.writers > 0 {
                    let early = if st.no_early || st.size <= first || !early_ok(&st.key) {
                        Vec::new()
                    } else {
                        // Parts S3 holds as they are (an fsync uploaded
                        // them) wait for the final upload.
                        let mut v = stale_parts(first, &st, true);
                        v.retain(|p| p.3 > st.uploaded);
                        v
                    };
                    if early.is_empty() {
                        // A filled part or the last close starts a task again.
                        st.task = false;
                        Step::Exit(None)
                    } else {
                        Step::Early(st.key.clone(), early)
                    }
                } else {
                    Step::Sleep(st.ready_at.unwrap_or(now))
                }
            };
            match step {
                Step::Exit(mpu) => {
                    if let Some(m) = mpu {
                        self.up.abort(&m.key, &m.id).await;
                    }
                    return;
                }
                Step::Early(key, parts) => {
                    if let Err(e) = self.send_parts(&f, &key, parts).await {
                        warn!(key = %key.escape_debug(),
                            "sending parts while the file is written failed; it is uploaded after its close: {e}");
                        let m = {
                            let mut st = f.st.lock().unwrap();
                            st.no_early = true;
                            st.mpu.take()
                        };
                        if let Some(m) = m {
                            self.up.abort(&m.key, &m.id).await;
                        }
                    }
                }
                Step::Sleep(until) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until.into()) => {}
                        _ = &mut wake => {}
                    }
                }
                Step::Upload(key, version, size) => {
                    self.upload_once(&f, key, version, size).await;
                    if f.st.lock().unwrap().unreachable {
                        self.watch_for_return();
                    }
                }
                Step::HandOver => {
                    if self.hand_over(&f).await {
                        return;
                    }
                }
            }
        }
    }

    async fn upload_once(&self, f: &Arc<Staged>, key: String, version: u64, size: u64) {
        // One upload of a name at a time: a replaced file's upload still in
        // flight lands before its successor's.
        let _order = self.upload_locks.lock(&key).await;
        {
            let st = f.st.lock().unwrap();
            if st.gone || st.key != key || st.version != version {
                return; // Changed while waiting: the task looks again.
            }
        }
        let start = Instant::now();
        metrics::gauge!(m::WRITE_UPLOADS_IN_FLIGHT).increment(1.0);
        let res = if size <= self.up.part_size {
            let stale = f.st.lock().unwrap().mpu.take();
            if let Some(m) = stale {
                self.up.abort(&m.key, &m.id).await;
            }
            self.up.put(&key, &f.file, size).await.map(|e| (e, version))
        } else {
            self.multipart(f, &key).await
        };
        metrics::gauge!(m::WRITE_UPLOADS_IN_FLIGHT).decrement(1.0);
        let (gone, renamed) = {
            let st = f.st.lock().unwrap();
            (st.gone, st.key != key)
        };
        if res.is_ok() && (gone || renamed) {
            // Unlinked, replaced or renamed while uploading: the object just
            // written is unwanted unless a staged file holds the name now
            // (its upload, after this one, replaces it).
            let delete = {
                let mut ov = self.ov.lock().unwrap();
                if ov.files.contains_key(&key) {
                    false
                } else if renamed && !gone {
                    ov.hidden.insert(key.clone());
                    let mut st = f.st.lock().unwrap();
                    if !st.stale_keys.contains(&key) {
                        st.stale_keys.push(key.clone());
                    }
                    false
                } else {
                    true
                }
            };
            if delete && self.up.store.delete(&key).await.is_err() {
                warn!(key = %key.escape_debug(), "deleting the object of a file removed while it uploaded failed");
            }
            f.settled.notify_waiters();
            return;
        }
        let mut st = f.st.lock().unwrap();
        match res {
            Ok((etag, version)) => {
                let secs = start.elapsed().as_secs_f64();
                metrics::histogram!(m::WRITE_UPLOAD_SECONDS).record(secs);
                // A checkpoint (past one part) or a file whose upload had
                // failed is worth a line at info; each small file is not.
                if size > self.up.part_size || st.failures > 0 {
                    info!(key = %key.escape_debug(), size, secs, failed_before = st.failures, "uploaded");
                } else {
                    debug!(key = %key.escape_debug(), size, secs, "uploaded");
                }
                st.uploaded = version;
                st.etag = etag;
                st.in_s3 = true;
                st.failed = None;
                st.failures = 0;
                st.unreachable = false;
            }
            Err(e) => {
                metrics::counter!(m::WRITE_UPLOAD_FAILURES).increment(1);
                let wait = self
                    .retry
                    .saturating_mul(1 << st.failures.min(10))
                    .min(MAX_RETRY);
                st.failures += 1;
                st.unreachable = matches!(
                    e,
                    crate::store::StoreError::Transient(_) | crate::store::StoreError::Throttled(_)
                );
                error!(key = %key.escape_debug(), size, staged = %self.staging.data_path(f.id).display(),
                    retry_in_secs = wait.as_secs_f64(),
                    "upload failed; the file stays in staging and is tried again: {e}");
                st.failed = Some((version, e.to_string()));
                st.urgent = 0;
                st.ready_at = Some(Instant::now() + wait);
            }
        }
        drop(st);
        f.settled.notify_waiters();
    }

    /// Starts probing S3 (one ListObjectsV2 of one key) every
    /// `write.retry_secs`, at most [`PROBE_EVERY`], unless a probe runs: a
    /// probe that fails and a later one that succeeds mean S3 is back, and
    /// the uploads that could not reach it are tried at once, not at the
    /// end of their backoff (up to [`MAX_RETRY`]). Uploads failing while S3
    /// answers lists keep their backoff. Probing ends when no upload waits.
    fn watch_for_return(self: &Arc<Self>) {
        {
            let mut probing = self.probing.lock().unwrap();
            if *probing {
                return;
            }
            *probing = true;
        }
        let this = self.clone();
        self.rt.spawn(async move { this.probe_until_back().await });
    }

    async fn probe_until_back(&self) {
        let mut seen_down = false;
        loop {
            tokio::time::sleep(self.retry.min(PROBE_EVERY)).await;
            let waiting = {
                let mut probing = self.probing.lock().unwrap();
                let waiting = self.waiting_for_s3();
                if waiting.is_empty() {
                    *probing = false;
                    return;
                }
                waiting
            };
            let key = waiting[0].st.lock().unwrap().key.clone();
            match self.up.store.list_page(&key, None, None, None, 1).await {
                Err(_) => seen_down = true,
                Ok(_) if seen_down => {
                    seen_down = false;
                    info!(
                        uploads = waiting.len(),
                        "S3 answers again: retrying the uploads that could not reach it"
                    );
                    let now = Instant::now();
                    for f in waiting {
                        let mut st = f.st.lock().unwrap();
                        if st.unreachable && st.ready_at.is_some_and(|t| t > now) {
                            st.ready_at = Some(now);
                        }
                        drop(st);
                        f.wake.notify_waiters();
                    }
                }
                Ok(_) => {}
            }
        }
    }

    /// Staged files whose last upload could not reach S3.
    fn waiting_for_s3(&self) -> Vec<Arc<Staged>> {
        self.ov
            .lock()
            .unwrap()
            .files
            .values()
            .filter(|f| {
                let st = f.st.lock().unwrap();
                st.unreachable && !st.gone
            })
            .cloned()
            .collect()
    }

    /// The multipart upload under way for `key`, created when there is
    /// none (one for another key, after a rename, is aborted): its id.
    async fn ensure_mpu(&self, f: &Staged, key: &str) -> Result<String, crate::store::StoreError> {
        let old = {
            let mut st = f.st.lock().unwrap();
            match &st.mpu {
                Some(m) if m.key == key => return Ok(m.id.clone()),
                _ => st.mpu.take(),
            }
        };
        if let Some(m) = old {
            self.up.abort(&m.key, &m.id).await;
        }
        let id = self.up.store.create_multipart(key).await?;
        tracing::debug!(key = %key.escape_debug(), upload_id = %id, staged = f.id, "multipart upload created");
        f.st.lock().unwrap().mpu = Some(Mpu {
            key: key.to_string(),
            id: id.clone(),
            parts: BTreeMap::new(),
        });
        Ok(id)
    }

    /// Sends `parts` of `f` to the multipart upload of `key`, several at
    /// once, recording each as it is answered.
    async fn send_parts(
        &self,
        f: &Staged,
        key: &str,
        parts: Vec<PartJob>,
    ) -> Result<(), crate::store::StoreError> {
        use futures::stream::StreamExt;
        let id = self.ensure_mpu(f, key).await?;
        let mut sent = futures::stream::iter(parts)
            .map(|(n, off, len, written)| {
                let id = id.clone();
                async move {
                    let etag = self.up.send_part(key, &id, &f.file, (n, off, len)).await?;
                    Ok::<_, crate::store::StoreError>((n, SentPart { etag, written, len }))
                }
            })
            .buffer_unordered(upload::MAX_PARTS_IN_FLIGHT);
        while let Some(r) = sent.next().await {
            let (n, part) = r?;
            let mut st = f.st.lock().unwrap();
            if let Some(m) = st.mpu.as_mut().filter(|m| m.id == id) {
                m.parts.insert(n, part);
            }
        }
        Ok(())
    }

    /// Uploads `f` as `key` by multipart upload: sends the parts S3 does not
    /// hold as they are now (those sent while writing are kept), then
    /// completes. The ETag and the version S3 then holds.
    async fn multipart(
        &self,
        f: &Staged,
        key: &str,
    ) -> Result<(String, u64), crate::store::StoreError> {
        let first = self.up.part_size;
        let res = async {
            loop {
                let todo = stale_parts(first, &f.st.lock().unwrap(), false);
                if !todo.is_empty() {
                    self.send_parts(f, key, todo).await?;
                    continue;
                }
                let (id, parts, version) = {
                    let st = f.st.lock().unwrap();
                    if !stale_parts(first, &st, false).is_empty() {
                        continue; // Changed meanwhile.
                    }
                    let Some(m) = st.mpu.as_ref().filter(|m| m.key == key) else {
                        continue;
                    };
                    let count = upload::parts(first, st.size)?.len() as u32;
                    let parts: Option<Vec<crate::store::UploadedPart>> = (1..=count)
                        .map(|n| {
                            m.parts.get(&n).map(|p| crate::store::UploadedPart {
                                number: n,
                                etag: p.etag.clone(),
                            })
                        })
                        .collect();
                    let Some(parts) = parts else {
                        continue; // A part's answer was for an older upload.
                    };
                    (m.id.clone(), parts, st.version)
                };
                let etag = self.up.complete(key, &id, &parts).await;
                let mut st = f.st.lock().unwrap();
                if st.mpu.as_ref().is_some_and(|m| m.id == id) {
                    st.mpu = None;
                }
                return etag.map(|e| (e, version));
            }
        }
        .await;
        if res.is_err() {
            let m = f.st.lock().unwrap().mpu.take();
            if let Some(m) = m {
                self.up.abort(&m.key, &m.id).await;
            }
        }
        res
    }

    /// Deletes the objects of `f`'s old names, then takes it out of the
    /// overlay and staging. False when it changed meanwhile (the task goes
    /// on) or a delete failed (tried again after the retry delay).
    async fn hand_over(&self, f: &Arc<Staged>) -> bool {
        let stale = f.st.lock().unwrap().stale_keys.clone();
        for k in &stale {
            if self.delete_unclaimed(k).await.is_err() {
                f.st.lock().unwrap().ready_at = Some(Instant::now() + self.retry);
                tokio::time::sleep(self.retry).await;
                return false;
            }
        }
        let done = {
            let st = f.st.lock().unwrap();
            if st.uploaded < st.version || st.writers > 0 || st.gone {
                return st.gone;
            }
            Uploaded {
                key: st.key.clone(),
                deleted: stale.clone(),
                etag: st.etag.clone(),
                size: st.size,
                inos: st.inos.clone(),
            }
        };
        if let Some(cb) = self.on_uploaded.get() {
            cb(done.clone()).await;
        }
        let kept = {
            let mut ov = self.ov.lock().unwrap();
            let mut st = f.st.lock().unwrap();
            if st.uploaded < st.version || st.writers > 0 || st.gone || st.key != done.key {
                return st.gone;
            }
            st.gone = true;
            st.task = false;
            st.stale_keys.clear();
            if let Some(m) = st.mpu.take() {
                // Parts sent for a version that was then put back as it was.
                let up = self.up.store.clone();
                self.rt
                    .spawn(async move { up.abort_multipart(&m.key, &m.id).await.ok() });
            }
            if ov.files.get(&st.key).is_some_and(|x| Arc::ptr_eq(x, f)) {
                ov.files.remove(&st.key);
            }
            for k in &stale {
                if !ov.files.contains_key(k) {
                    ov.hidden.remove(k);
                }
            }
            // Counted before the lock goes: `upload_all` must not see the
            // file gone and its bytes not yet being kept.
            let kept = self
                .on_kept
                .get()
                .and_then(|_| self.staging.set_aside(f.id))
                .map(|path| (path, self.keep()));
            self.staging.remove(f.id, st.size);
            if let Some(cb) = self.on_handed_over.get() {
                cb(&done);
            }
            kept
        };
        if let (Some((path, keeping)), Some(cb)) = (kept, self.on_kept.get()) {
            cb(done, path, keeping);
        }
        self.gauges();
        f.settled.notify_waiters();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_send_no_parts_while_written() {
        for k in ["ckpt/model.pt", "a/b/shard-00001.safetensors", "x"] {
            assert!(early_ok(k), "{k}");
        }
        for k in [
            "ckpt/model.pt.tmp",
            "tmpab12cd",
            "d/.tmp123",
            "f.part",
            "notes~",
        ] {
            assert!(!early_ok(k), "{k}");
        }
    }

    #[test]
    fn only_parts_changed_since_they_were_sent_are_stale() {
        let first = 8 << 20;
        let mut st = State::new("k".into(), 0);
        st.writers = 1;
        // 20 MiB written: parts 1 and 2 are full, part 3 is not.
        st.version = 1;
        st.size = 20 << 20;
        mark_written(first, &mut st, 0, 20 << 20);
        let full: Vec<u32> = stale_parts(first, &st, true).iter().map(|p| p.0).collect();
        assert_eq!(full, vec![1, 2]);
        st.mpu = Some(Mpu {
            key: "k".into(),
            id: "u".into(),
            parts: [1, 2]
                .into_iter()
                .map(|n| {
                    (
                        n,
                        SentPart {
                            etag: format!("e{n}"),
                            written: 1,
                            len: first,
                        },
                    )
                })
                .collect(),
        });
        assert_eq!(
            stale_parts(first, &st, false)
                .iter()
                .map(|p| p.0)
                .collect::<Vec<_>>(),
            vec![3]
        );
        // A write into part 1 makes it stale again; a truncate into part 2
        // changes its length.
        st.version = 2;
        mark_written(first, &mut st, 10, 20);
        st.version = 3;
        let old = st.size;
        st.size = 12 << 20;
        mark_written(first, &mut st, 12 << 20, old);
        let stale: Vec<u32> = stale_parts(first, &st, false).iter().map(|p| p.0).collect();
        assert_eq!(stale, vec![1, 2]);
    }
}
