//! Writable mounts end to end: files written through a real FUSE mount of
//! the in-process S3 server land in staging, are uploaded in the
//! background, and are the same bytes in the bucket and after a remount.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// Mounts `bucket` of `server` read-write with staging in `staging`.
fn rw(server: &TestServer, bucket: &str, staging: &Path, config: &str) -> Mount {
    MountSpec::new(bucket)
        .server(server)
        .args(&["--read-write", "--staging-dir", staging.to_str().unwrap()])
        .config(config)
        .mount()
}

/// A bucket tagged `tag` on a server of its own, mounted read-write with
/// `config` and staging in a fresh directory.
fn private_rw(tag: &str, config: &str) -> (TestServer, String, TempDir, Mount) {
    let server = private_server();
    let b = bucket_on(&server, tag);
    let staging = TempDir::new("staging");
    let m = rw(&server, &b, &staging.0, config);
    (server, b, staging, m)
}

/// renameat2(2) of `from` to `to` with RENAME_NOREPLACE, as `mv -n` asks.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let (from, to) = (c(from), c(to));
    // SAFETY: two valid NUL-terminated paths; renameat2 reads them only.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// [`rw`] with metrics served at the address returned.
fn rw_with_metrics(
    server: &TestServer,
    bucket: &str,
    staging: &Path,
    config: &str,
) -> (Mount, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let m = MountSpec::new(bucket)
        .server(server)
        .args(&[
            "--read-write",
            "--staging-dir",
            staging.to_str().unwrap(),
            "--metrics-addr",
            &addr,
        ])
        .config(config)
        .mount();
    (m, addr)
}

/// Waits (up to 120 s) until the bucket holds `want` at `key`.
fn wait_uploaded(server: &TestServer, bucket: &str, key: &str, want: &[u8], m: &Mount) {
    let ok = wait_for(Duration::from_secs(120), || {
        server.get(bucket, key).is_some_and(|b| b[..] == want[..])
    });
    assert!(
        ok.is_some(),
        "{key} not uploaded as written (bucket has {:?} bytes):\n{}",
        server.get(bucket, key).map(|b| b.len()),
        m.log()
    );
}

/// Staged data files (`<id>.data`) in `staging`.
fn staged(staging: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<_> = std::fs::read_dir(staging)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "data"))
        .collect();
    v.sort();
    v.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// A torch.save-style write (a zip writer: headers first, data, then a seek
/// back to patch the header, then the central directory at the end) of
/// 100 MB is byte-exact in the bucket and after a remount with an empty
/// cache.
#[test]
fn zip_style_saves_with_seeks_back_round_trip() {
    let b = bucket("w-zip");
    let staging = TempDir::new("staging");
    let body = data(100 << 20, 7);
    let mut want = vec![0u8; 4096];
    want[..4].copy_from_slice(b"PK\x03\x04");
    want[4..12].copy_from_slice(&(body.len() as u64).to_le_bytes());
    want.extend_from_slice(&body);
    want.extend_from_slice(b"PK\x01\x02 central directory");
    {
        let m = rw(server(), &b, &staging.0, "");
        std::fs::create_dir_all(m.p("ckpt/step-100")).unwrap();
        let path = m.p("ckpt/step-100/model.pt");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&[0u8; 4096]).unwrap();
        for chunk in body.chunks(1 << 20) {
            f.write_all(chunk).unwrap();
        }
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(&want[..12]).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b"PK\x01\x02 central directory").unwrap();
        drop(f);
        // Readable at once, from staging.
        assert!(
            std::fs::read(&path).unwrap() == want,
            "read back before upload"
        );
        wait_uploaded(server(), &b, "ckpt/step-100/model.pt", &want, &m);
        assert_eq!(server().keys(&b), vec!["ckpt/step-100/model.pt"]);
        wait_for(Duration::from_secs(10), || staged(&staging.0).is_empty())
            .expect("staging emptied once S3 has the file");
    }
    let m = Mount::new(&b, &[]);
    let got = std::fs::read(m.p("ckpt/step-100/model.pt")).unwrap();
    assert!(got == want, "remounted read differs ({} bytes)", got.len());
}

/// The temp-file-then-`os.replace` save uploads only the final name, and
/// the file reads back at once under it.
#[test]
fn temp_file_then_rename_uploads_only_the_final_name() {
    let server = private_server();
    let b = bucket_on(&server, "w-rename");
    let staging = TempDir::new("staging");
    let want = data(100 << 20, 8);
    let m = rw(&server, &b, &staging.0, "");
    std::fs::create_dir(m.p("run-7")).unwrap();
    let tmp = m.p("run-7/model.safetensors.tmp");
    std::fs::write(&tmp, &want).unwrap();
    std::fs::rename(&tmp, m.p("run-7/model.safetensors")).unwrap();
    assert!(std::fs::read(m.p("run-7/model.safetensors")).unwrap() == want);
    assert_errno(
        std::fs::metadata(&tmp),
        libc::ENOENT,
        "the temp name is gone",
    );
    assert_eq!(names(&m.p("run-7")), vec!["model.safetensors"]);
    wait_uploaded(&server, &b, "run-7/model.safetensors", &want, &m);
    assert_eq!(server.keys(&b), vec!["run-7/model.safetensors"]);
    // One multipart upload, of the final name; nothing sent for the temp
    // name, so nothing to copy or delete either.
    for (op, n) in [
        ("CreateMultipartUpload", 1),
        ("PutObject", 0),
        ("CopyObject", 0),
        ("DeleteObject", 0),
    ] {
        assert_eq!(server.request_count(op), n, "{op}");
    }
    drop(m);
    let m = MountSpec::new(&b).server(&server).mount();
    assert!(std::fs::read(m.p("run-7/model.safetensors")).unwrap() == want);
}

/// O_TRUNC overwrite and append of an existing object, out-of-order
/// pwrite, shrinking and growing truncate: each is in the bucket when
/// fsync returns.
#[test]
fn overwrite_append_pwrite_and_truncate_are_durable_at_fsync() {
    let server = private_server();
    let b = bucket_on(&server, "w-modes");
    server.put(&b, "d/old.bin", data(10_000, 1));
    let staging = TempDir::new("staging");
    let m = rw(&server, &b, &staging.0, "");
    // O_TRUNC overwrite of an object: its old bytes are never fetched.
    let new = data(3_000, 2);
    server.reset_counts();
    let mut f = std::fs::File::create(m.p("d/old.bin")).unwrap();
    f.write_all(&new).unwrap();
    f.sync_all().unwrap();
    assert_eq!(server.get(&b, "d/old.bin").unwrap(), new);
    assert_eq!(
        server.request_count("GetObject"),
        0,
        "O_TRUNC fetched the old object"
    );
    drop(f);
    // Append.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("d/old.bin"))
        .unwrap();
    f.write_all(b"tail").unwrap();
    f.sync_all().unwrap();
    let mut want = new.clone();
    want.extend_from_slice(b"tail");
    assert_eq!(server.get(&b, "d/old.bin").unwrap(), want);
    drop(f);
    // Out-of-order pwrite of a new file, with a hole.
    let f = std::fs::File::create(m.p("d/sparse.bin")).unwrap();
    f.write_all_at(b"END", 1_000_000).unwrap();
    f.write_all_at(b"START", 0).unwrap();
    f.write_all_at(b"MID", 500_000).unwrap();
    f.sync_all().unwrap();
    let mut sparse = vec![0u8; 1_000_003];
    sparse[..5].copy_from_slice(b"START");
    sparse[500_000..500_003].copy_from_slice(b"MID");
    sparse[1_000_000..].copy_from_slice(b"END");
    assert!(server.get(&b, "d/sparse.bin").unwrap()[..] == sparse[..]);
    drop(f);
    // truncate(2) by path, shrinking then growing.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("d/sparse.bin"))
        .unwrap();
    f.set_len(400).unwrap();
    f.set_len(600).unwrap();
    f.sync_all().unwrap();
    let mut t = sparse[..400].to_vec();
    t.resize(600, 0);
    assert_eq!(server.get(&b, "d/sparse.bin").unwrap(), t);
    assert_eq!(std::fs::metadata(m.p("d/sparse.bin")).unwrap().len(), 600);
    drop(f);
    // unlink of an uploaded file removes the object.
    std::fs::remove_file(m.p("d/sparse.bin")).unwrap();
    assert!(server.get(&b, "d/sparse.bin").is_none());
    assert_eq!(names(&m.p("d")), vec!["old.bin"]);
    drop(m);
    let m = MountSpec::new(&b).server(&server).mount();
    assert_eq!(std::fs::read(m.p("d/old.bin")).unwrap(), want);
}

/// A server that rejects the upload: fsync fails with EIO, the bytes stay
/// in staging and readable, and once the server takes uploads again the
/// next fsync succeeds.
#[test]
fn fsync_reports_a_rejected_upload_and_keeps_the_file() {
    let (server, b, staging, m) = private_rw("w-reject", "[write]\nretry_secs = 3600\n");
    server.fail_next("PutObject", 403, 1000);
    let want = data(50_000, 3);
    let mut f = std::fs::File::create(m.p("ckpt.bin")).unwrap();
    f.write_all(&want).unwrap();
    assert_errno(f.sync_all(), libc::EIO, "fsync of a rejected upload");
    assert_eq!(staged(&staging.0), vec![want.clone()]);
    assert_eq!(std::fs::read(m.p("ckpt.bin")).unwrap(), want);
    assert!(server.get(&b, "ckpt.bin").is_none());
    assert!(m.log().contains("upload failed"), "{}", m.log());
    server.fail_next("PutObject", 403, 0);
    f.sync_all().unwrap();
    assert_eq!(server.get(&b, "ckpt.bin").unwrap(), want);
}

/// S3 ops a writable mount sends: all failed with 500 by [`fail_s3`].
const S3_OPS: [&str; 9] = [
    "ListObjectsV2",
    "HeadObject",
    "GetObject",
    "PutObject",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "CopyObject",
    "DeleteObject",
];

/// Makes every S3 request of [`S3_OPS`] fail with 500 (on), or none (off).
fn fail_s3(server: &TestServer, on: bool) {
    for op in S3_OPS {
        server.fail_next(op, 500, if on { 1_000_000 } else { 0 });
    }
}

/// A CreateMultipartUpload whose answer is lost (the server made the
/// upload, the client saw a failure and sent it again) leaves no upload
/// pending: the one nobody got the id of is aborted.
#[test]
fn a_create_whose_answer_was_lost_leaves_no_pending_upload() {
    let (server, b, _staging, m) = private_rw("w-lost", "[write]\npart_size = \"5MiB\"\n");
    server.lose_answers("CreateMultipartUpload", 1);
    let want = data(11 << 20, 9);
    let mut f = std::fs::File::create(m.p("ck.pt")).unwrap();
    std::io::Write::write_all(&mut f, &want).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(server.get(&b, "ck.pt").unwrap(), want);
    assert_eq!(server.request_count("CreateMultipartUpload"), 2);
    assert_eq!(server.open_uploads(&b), Vec::<String>::new(), "{}", m.log());
}

/// A file whose upload could not reach S3 is uploaded soon after S3
/// answers again, not at the end of its backoff: the mount probes S3 while
/// such an upload waits. S3 failing with 500 (InternalError) and with 503
/// (SlowDown, as a MinIO starting up answers).
#[test]
fn an_upload_that_could_not_reach_s3_goes_soon_after_s3_is_back() {
    for status in [500, 503] {
        let (server, b, _staging, m) = private_rw(
            &format!("w-back-{status}"),
            "[write]\nretry_secs = 0.5\nupload_delay_secs = 0\n",
        );
        // Created while S3 answers (a 503 to its lookup would fail the
        // create), written and closed while it fails.
        let mut f = std::fs::File::create(m.p("ck.pt")).unwrap();
        for op in S3_OPS {
            server.fail_next(op, status, 1_000_000);
        }
        let want = data(20_000, 7);
        f.write_all(&want).unwrap();
        drop(f);
        // Failed tries until the next one waits 8 s or more.
        let waits = |log: &str| -> Vec<f64> {
            log.lines()
                .filter(|l| l.contains("upload failed"))
                .filter_map(|l| l.split("retry_in_secs=").nth(1))
                .filter_map(|v| v.split_whitespace().next()?.parse().ok())
                .collect()
        };
        let t = Instant::now();
        while !waits(&m.log()).iter().any(|&w| w >= 8.0) {
            assert!(t.elapsed() < Duration::from_secs(60), "{}", m.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        fail_s3(&server, false);
        let back = Instant::now();
        while server.get(&b, "ck.pt").is_none() {
            assert!(
                back.elapsed() < Duration::from_secs(5),
                "{status}: not uploaded within 5 s of S3's return: {}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(server.get(&b, "ck.pt").unwrap(), want);
        assert!(m.log().contains("S3 answers again"), "{}", m.log());
    }
}

/// While S3 cannot be reached, checkpoints are still written: a new name
/// (in a listed directory past its TTL, in a directory made on this mount
/// and never listed, in a directory made meanwhile), written whole
/// (O_TRUNC) or under a temporary name renamed into place (also with
/// RENAME_NOREPLACE, as `mv` asks), is staged and uploaded once S3 is
/// back. An append to a name S3 cannot be asked about would lose the
/// object's bytes: EIO.
#[test]
fn checkpoints_are_written_while_s3_cannot_be_reached() {
    let (server, b, _staging, m) = private_rw(
        "w-outage",
        "[metadata]\nttl_secs = 1\n[write]\nretry_secs = 3600\n",
    );
    std::fs::write(m.p("before.pt"), b"before").unwrap();
    // In S3 before the outage (its upload would otherwise wait for
    // retry_secs).
    std::fs::File::open(m.p("before.pt"))
        .unwrap()
        .sync_all()
        .unwrap();
    std::fs::create_dir(m.p("local")).unwrap();
    assert_eq!(names(&m.path()), vec!["before.pt", "local"]);
    std::thread::sleep(Duration::from_millis(1500));
    fail_s3(&server, true);
    let want = [
        ("new.pt", data(70_000, 1)),
        ("local/x.pt", data(1_000, 2)),
        ("made/y.pt", data(2_000, 3)),
        ("final.pt", data(3_000, 4)),
        ("noreplace.pt", data(4_000, 5)),
    ];
    std::fs::write(m.p("new.pt"), &want[0].1).unwrap();
    std::fs::write(m.p("local/x.pt"), &want[1].1).unwrap();
    std::fs::create_dir(m.p("made")).unwrap();
    std::fs::write(m.p("made/y.pt"), &want[2].1).unwrap();
    std::fs::write(m.p("final.pt.tmp"), &want[3].1).unwrap();
    std::fs::rename(m.p("final.pt.tmp"), m.p("final.pt")).unwrap();
    std::fs::write(m.p("noreplace.tmp"), &want[4].1).unwrap();
    rename_noreplace(&m.p("noreplace.tmp"), &m.p("noreplace.pt")).unwrap();
    let append = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(m.p("log.txt"));
    assert_errno(
        append,
        libc::EIO,
        "append to a name S3 cannot be asked about",
    );
    for (k, d) in &want {
        assert_eq!(std::fs::read(m.p(k)).unwrap(), *d, "{k} read back");
    }
    assert!(server.get(&b, "new.pt").is_none());
    fail_s3(&server, false);
    for (k, _) in &want {
        std::fs::File::open(m.p(k)).unwrap().sync_all().unwrap();
    }
    for (k, d) in &want {
        assert_eq!(server.get(&b, k).as_deref(), Some(&d[..]), "{k} in S3");
    }
    let mut keys = server.keys(&b);
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "before.pt",
            "final.pt",
            "local/x.pt",
            "made/y.pt",
            "new.pt",
            "noreplace.pt"
        ]
    );
}

/// A name whose key S3 would refuse (over 1,024 bytes) is ENAMETOOLONG when
/// it is made (create, mkdir, rename, and the rename of a directory that
/// would lengthen a key under it past the limit), never a file staged that
/// no upload can take; a key of exactly 1,024 bytes is uploaded.
#[test]
fn keys_longer_than_s3_takes_are_refused_when_made() {
    let (server, b, _staging, m) = private_rw("w-longkey", "");
    let c = "d".repeat(250);
    let dir = format!("{c}/{c}/{c}/{c}");
    std::fs::create_dir_all(m.p(&dir)).unwrap();
    // 4 x 251 bytes of directories, then 20: 1,024 bytes.
    let fits = format!("{dir}/{}", "x".repeat(20));
    std::fs::write(m.p(&fits), b"fits").unwrap();
    let long = format!("{dir}/{}", "x".repeat(21));
    assert_errno(
        std::fs::write(m.p(&long), b"no"),
        libc::ENAMETOOLONG,
        "create",
    );
    assert_errno(std::fs::create_dir(m.p(&long)), libc::ENAMETOOLONG, "mkdir");
    assert_errno(
        std::fs::rename(m.p(&fits), m.p(&long)),
        libc::ENAMETOOLONG,
        "rename",
    );
    let last = format!("{c}/{c}/{c}/{c}");
    let longer = format!("{c}/{c}/{c}/{c}e");
    assert_errno(
        std::fs::rename(m.p(&last), m.p(&longer)),
        libc::ENAMETOOLONG,
        "rename of a directory",
    );
    std::fs::File::open(m.p(&fits)).unwrap().sync_all().unwrap();
    assert_eq!(server.get(&b, &fits).as_deref(), Some(&b"fits"[..]));
    assert_eq!(server.keys(&b), vec![fits]);
}

/// A daemon killed (SIGKILL) while a multipart upload is in flight: the
/// next start aborts that upload and uploads the staged file again.
#[test]
fn a_killed_daemon_uploads_staged_files_at_its_next_start() {
    let server = private_server();
    let b = bucket_on(&server, "w-kill");
    let staging = TempDir::new("staging");
    let want = data(24 << 20, 4);
    let config = "[write]\nupload_delay_secs = 0\n";
    {
        let mut m = rw(&server, &b, &staging.0, config);
        server.set_delay("UploadPart", "", Duration::from_secs(30));
        std::fs::write(m.p("big.bin"), &want).unwrap();
        wait_for(Duration::from_secs(30), || {
            server.request_count("UploadPart") > 0
        })
        .expect("the upload started");
        let mut child = m.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(m.path())
            .status();
    }
    assert!(server.get(&b, "big.bin").is_none());
    server.set_delay("UploadPart", "", Duration::ZERO);
    let m = rw(&server, &b, &staging.0, config);
    wait_uploaded(&server, &b, "big.bin", &want, &m);
    assert!(
        server.request_count("AbortMultipartUpload") >= 1,
        "{}",
        m.log()
    );
    wait_for(Duration::from_secs(10), || staged(&staging.0).is_empty()).expect("staging emptied");
}

/// A fresh bucket tagged `tag` mounted read-write with 1 MiB of staging, no
/// upload before an fsync, writers by passthrough or not.
fn small_staging(tag: &str, passthrough: bool) -> (String, TempDir, Mount) {
    let b = bucket(tag);
    let staging = TempDir::new("staging");
    let config = format!(
        "[write]\nstaging_max_size = 1048576\nupload_delay_secs = 3600\npassthrough = {passthrough}\n"
    );
    let m = rw(server(), &b, &staging.0, &config);
    (b, staging, m)
}

/// Staging full: the write past `write.staging_max_size` fails with ENOSPC;
/// what was written before stays and is uploaded. (Writes through lakemount;
/// passthrough writers are the next test.)
#[test]
fn staging_full_is_enospc_and_loses_nothing() {
    let (b, _staging, m) = small_staging("w-full", false);
    let first = data(700_000, 5);
    std::fs::write(m.p("a.bin"), &first).unwrap();
    let mut f = std::fs::File::create(m.p("b.bin")).unwrap();
    let r = f.write_all(&data(700_000, 6));
    assert_errno(r, libc::ENOSPC, "a write past the staging limit");
    drop(f);
    assert_eq!(std::fs::read(m.p("a.bin")).unwrap(), first);
    let f = std::fs::File::open(m.p("a.bin")).unwrap();
    f.sync_all().unwrap();
    assert_eq!(server().get(&b, "a.bin").unwrap(), first);
    // Removing the partial file frees its room: the write now fits.
    std::fs::remove_file(m.p("b.bin")).unwrap();
    let second = data(300_000, 6);
    std::fs::write(m.p("b.bin"), &second).unwrap();
    assert_eq!(std::fs::read(m.p("b.bin")).unwrap(), second);
}

/// Directories: mkdir, rmdir of an empty one, ENOTEMPTY for a full one,
/// and rename of a directory of uploaded and staged files moves every key.
#[test]
fn directories_are_made_removed_and_renamed() {
    let b = bucket("w-dirs");
    server().put(&b, "run/a.bin", data(1_000, 1));
    let staging = TempDir::new("staging");
    let m = rw(
        server(),
        &b,
        &staging.0,
        "[write]\nupload_delay_secs = 3600\n",
    );
    std::fs::create_dir(m.p("empty")).unwrap();
    assert_errno(
        std::fs::create_dir(m.p("empty")),
        libc::EEXIST,
        "mkdir twice",
    );
    std::fs::remove_dir(m.p("empty")).unwrap();
    assert_errno(std::fs::metadata(m.p("empty")), libc::ENOENT, "after rmdir");
    std::fs::write(m.p("run/b.bin"), b"staged").unwrap();
    assert_errno(
        std::fs::remove_dir(m.p("run")),
        libc::ENOTEMPTY,
        "rmdir of a full dir",
    );
    std::fs::rename(m.p("run"), m.p("done")).unwrap();
    assert_eq!(names(&m.p("done")), vec!["a.bin", "b.bin"]);
    assert_errno(std::fs::metadata(m.p("run")), libc::ENOENT, "the old name");
    let f = std::fs::File::open(m.p("done/b.bin")).unwrap();
    f.sync_all().unwrap();
    let mut keys = server().keys(&b);
    keys.sort();
    assert_eq!(keys, vec!["done/a.bin", "done/b.bin"]);
    assert_eq!(server().get(&b, "done/a.bin").unwrap(), data(1_000, 1));
    assert_eq!(&server().get(&b, "done/b.bin").unwrap()[..], b"staged");
}

/// Unmounting (SIGTERM) uploads what is still staged before the daemon exits.
#[test]
fn unmount_uploads_what_is_staged() {
    let b = bucket("w-unmount");
    let staging = TempDir::new("staging");
    let mut m = rw(
        server(),
        &b,
        &staging.0,
        "[write]\nupload_delay_secs = 3600\n",
    );
    std::fs::write(m.p("last.bin"), b"written just before shutdown").unwrap();
    assert!(server().get(&b, "last.bin").is_none());
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    assert_eq!(
        &server().get(&b, "last.bin").unwrap()[..],
        b"written just before shutdown"
    );
    assert!(staged(&staging.0).is_empty());
}

/// Renames and unlinks around staged and uploaded files: an unlinked file
/// never uploaded leaves no key; a file renamed away and back keeps its
/// name; a name freed by a rename and written again keeps the new file;
/// rename onto a staged file replaces it; RENAME_NOREPLACE and the
/// file/directory mismatches give their errors.
#[test]
fn renames_and_unlinks_keep_the_right_objects() {
    let b = bucket("w-renames");
    server().put(&b, "a", b"old-a".to_vec());
    server().put(&b, "c", b"old-c".to_vec());
    let staging = TempDir::new("staging");
    let m = rw(
        server(),
        &b,
        &staging.0,
        "[write]\nupload_delay_secs = 3600\n",
    );
    // Written, then removed before any upload.
    std::fs::write(m.p("tmp.bin"), b"scratch").unwrap();
    std::fs::remove_file(m.p("tmp.bin")).unwrap();
    // a: appended (staged over its object), renamed away and back.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("a"))
        .unwrap();
    f.write_all(b"+1").unwrap();
    drop(f);
    std::fs::rename(m.p("a"), m.p("b")).unwrap();
    std::fs::rename(m.p("b"), m.p("a")).unwrap();
    // c: appended, renamed to d, and a new c written in its place.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("c"))
        .unwrap();
    f.write_all(b"+2").unwrap();
    drop(f);
    std::fs::rename(m.p("c"), m.p("d")).unwrap_or_else(|e| panic!("{e}: {}", m.log()));
    std::fs::write(m.p("c"), b"new-c").unwrap();
    // x onto y, both staged.
    std::fs::write(m.p("x"), b"from-x").unwrap();
    std::fs::write(m.p("y"), b"from-y").unwrap();
    std::fs::rename(m.p("x"), m.p("y")).unwrap();
    assert_eq!(std::fs::read(m.p("y")).unwrap(), b"from-x");
    // Errors.
    std::fs::create_dir(m.p("dir")).unwrap();
    assert_errno(
        std::fs::rename(m.p("y"), m.p("dir")),
        libc::EISDIR,
        "file onto dir",
    );
    assert_errno(
        std::fs::rename(m.p("dir"), m.p("y")),
        libc::ENOTDIR,
        "dir onto file",
    );
    assert_eq!(
        rename_noreplace(&m.p("a"), &m.p("y")).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EEXIST))
    );
    let mut listed = names(&m.path());
    listed.sort();
    assert_eq!(listed, vec!["a", "c", "d", "dir", "y"]);
    drop(m); // Unmount uploads what is staged.
    // Nothing is left in staging: no data file, no record (a file unlinked
    // just after its close included).
    let left: Vec<_> = std::fs::read_dir(&staging.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "lock" && n != "origin")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let mut keys = server().keys(&b);
    keys.sort();
    assert_eq!(keys, vec!["a", "c", "d", "y"]);
    assert_eq!(&server().get(&b, "a").unwrap()[..], b"old-a+1");
    assert_eq!(&server().get(&b, "c").unwrap()[..], b"new-c");
    assert_eq!(&server().get(&b, "d").unwrap()[..], b"old-c+2");
    assert_eq!(&server().get(&b, "y").unwrap()[..], b"from-x");
}

/// A large file's full parts are sent while it is still being written; a
/// part changed after it was sent (a header patched at the end) is sent
/// again, so the object is still byte-exact.
#[test]
fn parts_are_sent_while_the_file_is_written() {
    let server = private_server();
    let b = bucket_on(&server, "w-early");
    let staging = TempDir::new("staging");
    // Through lakemount: a passthrough writer's parts wait for its close.
    let m = rw(&server, &b, &staging.0, "[write]\npassthrough = false\n");
    let mut want = data(40 << 20, 9);
    let mut f = std::fs::File::create(m.p("big.bin")).unwrap();
    f.write_all(&want).unwrap();
    wait_for(Duration::from_secs(30), || {
        server.request_count("UploadPart") >= 3
    })
    .unwrap_or_else(|| panic!("no part sent while the file is open:\n{}", m.log()));
    assert!(server.get(&b, "big.bin").is_none());
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"HEADER").unwrap();
    want[..6].copy_from_slice(b"HEADER");
    f.sync_all().unwrap();
    assert!(server.get(&b, "big.bin").unwrap()[..] == want[..]);
    drop(f);
    assert_eq!(
        server.request_count("CreateMultipartUpload"),
        1,
        "{:?}\n{}",
        server.request_counts(),
        m.log()
    );
    // 5 parts of 8 MiB; part 1 sent twice.
    assert!(
        server.request_count("UploadPart") >= 6,
        "{:?}",
        server.request_counts()
    );
}

/// Writes do not each ask the daemon for `security.capability` (the kernel's
/// kill-privileges check): with FUSE_HANDLE_KILLPRIV_V2 it asks once per file.
/// (Writes through lakemount: passthrough writes send no request at all.)
#[test]
fn writes_send_no_getxattr_each() {
    let b = bucket("w-xattr");
    let staging = TempDir::new("staging");
    let (m, addr) = rw_with_metrics(server(), &b, &staging.0, "[write]\npassthrough = false\n");
    let chunk = data(1 << 20, 4);
    let mut f = std::fs::File::create(m.p("x.bin")).unwrap();
    for _ in 0..64 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let body = scrape(&addr);
    let count = |op: &str| -> u64 {
        let series = format!("lakemount_fuse_requests_total{{op=\"{op}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    assert!(count("write") >= 64, "{body}");
    assert!(count("getxattr") <= 2, "{body}");
}

/// A directory rename that fails part way leaves S3 as it was: the copies
/// made before the failure are deleted. When they cannot be, the mount
/// shows what S3 holds, the new name included, in listings and lookups
/// alike.
#[test]
fn a_directory_rename_that_fails_part_way_is_undone_or_shown_as_it_is() {
    let server = private_server();
    let b = bucket_on(&server, "w-dirfail");
    server.put(&b, "d/1", "one");
    let big = data(6 << 20, 3);
    server.put(&b, "d/2", big.clone());
    let staging = TempDir::new("staging");
    let m = rw(
        &server,
        &b,
        &staging.0,
        "[write]\nmax_copy_size = \"5MiB\"\n",
    );
    let refused = |m: &Mount| {
        // As `mv` does: the new name is checked first (a negative answer).
        assert!(!m.p("e").exists());
        // d/1 is copied by CopyObject, d/2 by UploadPartCopy: refused.
        server.fail_next("UploadPartCopy", 403, 1);
        assert!(std::fs::rename(m.p("d"), m.p("e")).is_err());
    };
    refused(&m);
    let mut keys = server.keys(&b);
    keys.sort();
    assert_eq!(keys, vec!["d/1", "d/2"], "the copy of d/1 was not undone");
    assert_eq!(names(&m.path()), vec!["d"]);
    assert!(!m.p("e").exists());
    assert_eq!(std::fs::read(m.p("d/2")).unwrap(), big);
    // The undo fails too: e/1 stays in S3, and the mount shows it.
    server.fail_next("DeleteObject", 500, 1_000);
    refused(&m);
    server.fail_next("DeleteObject", 500, 0);
    assert!(server.get(&b, "e/1").is_some());
    assert_eq!(names(&m.path()), vec!["d", "e"]);
    assert!(m.p("e").is_dir(), "listed but not found: {}", m.log());
    assert_eq!(std::fs::read_to_string(m.p("e/1")).unwrap(), "one");
    assert_eq!(std::fs::read(m.p("d/2")).unwrap(), big);
    // Onto an empty directory that is only a marker, from a directory with
    // a marker of its own: the undo keeps the target's marker.
    server.put(&b, "d/", "");
    server.put(&b, "f/", "");
    server.fail_next("UploadPartCopy", 403, 1);
    assert!(std::fs::rename(m.p("d"), m.p("f")).is_err());
    let mut keys = server.keys(&b);
    keys.sort();
    assert_eq!(keys, vec!["d/", "d/1", "d/2", "e/1", "f/"]);
}

/// Uploads with signed payloads (`s3.sign_payload = true`, for servers that
/// refuse UNSIGNED-PAYLOAD) land byte-exact too: a PUT and a multipart upload.
#[test]
fn signed_payload_uploads_round_trip() {
    let (server, b, _staging, m) = private_rw("w-signed", "[s3]\nsign_payload = true\n");
    let small = data(10_000, 1);
    let big = data(20 << 20, 2);
    std::fs::write(m.p("small.bin"), &small).unwrap();
    let mut f = std::fs::File::create(m.p("big.bin")).unwrap();
    f.write_all(&big).unwrap();
    f.sync_all().unwrap();
    drop(f);
    wait_uploaded(&server, &b, "small.bin", &small, &m);
    wait_uploaded(&server, &b, "big.bin", &big, &m);
    assert!(
        server.request_count("UploadPart") >= 3,
        "{:?}",
        server.request_counts()
    );
}

/// A rename of an object larger than `write.max_copy_size` copies it as a
/// multipart upload of UploadPartCopy parts (the 5 GiB CopyObject limit,
/// scaled down), for a file and for a directory holding one; the copies are
/// byte-exact and readable at once under the new names, the old keys gone;
/// a refused part fails the rename, aborts the upload and moves nothing.
#[test]
fn renames_past_one_copy_object_copy_part_by_part() {
    let server = private_server();
    let b = bucket_on(&server, "w-bigcopy");
    let big = data((12 << 20) + 1, 3);
    server.put(&b, "big.bin", big.clone());
    server.put(&b, "dir/inner.bin", big.clone());
    server.put(&b, "dir/small.bin", data(100, 4));
    let staging = TempDir::new("staging");
    let m = rw(
        &server,
        &b,
        &staging.0,
        "[write]\nmax_copy_size = \"5MiB\"\n",
    );
    server.reset_counts();
    std::fs::rename(m.p("big.bin"), m.p("moved.bin"))
        .unwrap_or_else(|e| panic!("{e}: {}", m.log()));
    // 12 MiB + 1 byte in parts of 5 MiB: 5, 5 and 2 MiB + 1 byte.
    assert_eq!(
        server.request_count("UploadPartCopy"),
        3,
        "{:?}",
        server.request_counts()
    );
    assert_eq!(server.request_count("CopyObject"), 0);
    assert_eq!(server.get(&b, "moved.bin").as_deref(), Some(&big[..]));
    assert!(server.get(&b, "big.bin").is_none());
    assert_eq!(std::fs::read(m.p("moved.bin")).unwrap(), big);

    std::fs::rename(m.p("dir"), m.p("dir2")).unwrap_or_else(|e| panic!("{e}: {}", m.log()));
    let mut keys = server.keys(&b);
    keys.sort();
    assert_eq!(keys, vec!["dir2/inner.bin", "dir2/small.bin", "moved.bin"]);
    assert_eq!(server.get(&b, "dir2/inner.bin").as_deref(), Some(&big[..]));
    assert_eq!(server.get(&b, "dir2/small.bin").unwrap(), data(100, 4));
    assert_eq!(server.request_count("UploadPartCopy"), 6);
    assert_eq!(
        server.request_count("CopyObject"),
        1,
        "the small file: one CopyObject"
    );

    // A part the server refuses fails the rename: the upload is aborted,
    // no part is left, and both names stay as they were.
    server.fail_next("UploadPartCopy", 403, 1);
    let r = std::fs::rename(m.p("moved.bin"), m.p("again.bin"));
    assert!(r.is_err(), "rename succeeded past a refused part");
    assert!(server.get(&b, "again.bin").is_none());
    assert_eq!(server.get(&b, "moved.bin").as_deref(), Some(&big[..]));
    assert_eq!(std::fs::read(m.p("moved.bin")).unwrap(), big);
    assert_errno(
        std::fs::metadata(m.p("again.bin")),
        libc::ENOENT,
        "the new name",
    );
    assert_eq!(
        server.request_count("AbortMultipartUpload"),
        1,
        "{:?}",
        server.request_counts()
    );
    assert!(
        server.open_uploads(&b).is_empty(),
        "an upload was left open"
    );
}

/// Writers are served by FUSE passthrough (`write.passthrough`, the
/// default): the kernel writes the staged data file itself, so no write
/// request reaches lakemount, yet sizes are right while the file is open,
/// another open reads the bytes at once, ftruncate and O_APPEND work,
/// fsync makes the file durable, and the close uploads it byte-exact.
#[test]
fn writers_go_to_staging_by_passthrough() {
    let b = bucket("w-passthrough");
    let staging = TempDir::new("staging");
    let (m, addr) = rw_with_metrics(server(), &b, &staging.0, "");
    let path = m.p("ckpt/rank-0.pt");
    std::fs::create_dir_all(m.p("ckpt")).unwrap();
    let mut want = data(24 << 20, 11);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&want).unwrap();
    // Sizes while the writer is open: fstat, and stat by another caller.
    assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), want.len() as u64);
    // Another open reads what was written, at once.
    assert!(std::fs::read(&path).unwrap() == want, "read while open");
    // fsync: durable in S3 while still open.
    f.sync_all().unwrap();
    assert!(server().get(&b, "ckpt/rank-0.pt").unwrap()[..] == want[..]);
    // Shrink, patch a header by pwrite, close: uploaded as it is now.
    f.set_len(20 << 20).unwrap();
    want.truncate(20 << 20);
    f.write_all_at(b"HEADER", 0).unwrap();
    want[..6].copy_from_slice(b"HEADER");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), want.len() as u64);
    drop(f);
    wait_uploaded(server(), &b, "ckpt/rank-0.pt", &want, &m);
    // Append to the uploaded file: staged again, by passthrough again.
    let mut a = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    a.write_all(b"tail").unwrap();
    want.extend_from_slice(b"tail");
    a.sync_all().unwrap();
    drop(a);
    assert!(server().get(&b, "ckpt/rank-0.pt").unwrap()[..] == want[..]);
    assert!(std::fs::read(&path).unwrap() == want, "read after append");
    let body = scrape(&addr);
    assert!(
        metric(&body, "lakemount_write_passthrough_opens_total") >= 2.0,
        "{body}"
    );
    let writes = "lakemount_fuse_requests_total{op=\"write\"}";
    assert!(
        !body.lines().any(|l| l.starts_with(writes)),
        "a write request reached lakemount:\n{body}"
    );
}

/// A passthrough writer is let in only while staging has room; what it
/// writes is kept and uploaded even past the limit (the kernel has written
/// it), and the next writer, with staging over its limit, writes through
/// lakemount and gets ENOSPC. Nothing is lost.
#[test]
fn a_passthrough_writer_past_the_staging_limit_loses_nothing() {
    let (b, staging, m) = small_staging("w-pt-full", true);
    let big = data(1_500_000, 12);
    std::fs::write(m.p("a.bin"), &big).unwrap();
    assert_eq!(std::fs::read(m.p("a.bin")).unwrap(), big);
    let mut f = std::fs::File::create(m.p("b.bin")).unwrap();
    let r = f.write_all(&data(10_000, 13));
    assert_errno(r, libc::ENOSPC, "a write with staging over its limit");
    drop(f);
    std::fs::remove_file(m.p("b.bin")).unwrap();
    assert!(staged(&staging.0) == vec![big.clone()], "a.bin not kept");
    let f = std::fs::File::open(m.p("a.bin")).unwrap();
    f.sync_all().unwrap();
    assert!(server().get(&b, "a.bin").unwrap() == big);
}

/// Passthrough writers one after another, each closed before the next
/// opens (the kernel sends a close's release later, on its own): the one
/// that opens with staging past its limit is refused, even when the
/// previous writer's release has not reached lakemount yet.
#[test]
fn sequential_passthrough_writers_stop_at_the_staging_limit() {
    let (_b, _staging, m) = small_staging("w-pt-seq", true);
    for round in 0..5 {
        let dir = format!("r{round}");
        std::fs::create_dir(m.p(&dir)).unwrap();
        let written: Vec<bool> = (0..4)
            .map(|i| std::fs::write(m.p(&format!("{dir}/{i}.bin")), data(600_000, i)).is_ok())
            .collect();
        // 0 under the limit, 1 let in under it and past it, 2 and 3 refused.
        assert_eq!(written, vec![true, true, false, false], "round {round}");
        for i in 0..4 {
            let _ = std::fs::remove_file(m.p(&format!("{dir}/{i}.bin")));
        }
    }
}

/// With a data cache, an uploaded file becomes an ordinary cached object:
/// it is read after its upload, and after a remount on the same cache,
/// with no GET (a large file and a small, packed one).
#[test]
fn uploaded_files_are_read_from_the_cache_without_a_get() {
    let server = private_server();
    let b = bucket_on(&server, "w-adopt");
    let staging = TempDir::new("staging");
    let cache = TempDir::new("cache");
    let config = format!(
        "[cache]\ndir = {:?}\nmin_free = 0\nmemory_size = 0\n",
        cache.0.display().to_string()
    );
    let big = data(5 << 20, 21);
    let small = data(9_000, 22);
    // Files in the cache's object and pack directories.
    let read_both_without_a_get = |m: &Mount, when: &str| {
        assert!(std::fs::read(m.p("big.bin")).unwrap() == big, "{when}");
        assert!(std::fs::read(m.p("small.json")).unwrap() == small, "{when}");
        assert_eq!(
            server.request_count("GetObject"),
            0,
            "{when}: {:?}\n{}",
            server.request_counts(),
            m.log()
        );
    };
    let cached_files = || {
        let mut n = 0;
        let mut dirs = vec![cache.0.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.to_string_lossy().contains("/objects/")
                    || p.to_string_lossy().contains("/packs/")
                {
                    n += 1;
                }
            }
        }
        n
    };
    {
        let m = rw(&server, &b, &staging.0, &config);
        std::fs::write(m.p("big.bin"), &big).unwrap();
        std::fs::write(m.p("small.json"), &small).unwrap();
        wait_uploaded(&server, &b, "big.bin", &big, &m);
        wait_uploaded(&server, &b, "small.json", &small, &m);
        // Staging empties once each file is handed over and copied.
        let empty = wait_for(Duration::from_secs(30), || {
            std::fs::read_dir(&staging.0)
                .unwrap()
                .filter_map(|e| e.ok())
                .all(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    !n.ends_with(".data") && !n.ends_with(".uploaded")
                })
        });
        assert!(empty.is_some(), "staging not emptied:\n{}", m.log());
        assert!(cached_files() >= 2, "nothing in the cache:\n{}", m.log());
        read_both_without_a_get(&m, "after the upload");
    }
    let m = MountSpec::new(&b).server(&server).config(&config).mount();
    read_both_without_a_get(&m, "after a remount");
}

/// An unmount right after a close waits for the upload and for the data
/// cache to take the uploaded file, so nothing is left in staging and the
/// next mount reads it with no GET.
#[test]
fn an_unmount_right_after_a_close_leaves_the_uploaded_file_cached() {
    let server = private_server();
    let b = bucket_on(&server, "w-adopt-stop");
    let staging = TempDir::new("staging");
    let cache = TempDir::new("cache");
    let config = format!(
        "[cache]\ndir = {:?}\nmin_free = 0\nmemory_size = 0\n",
        cache.0.display().to_string()
    );
    let big = data(96 << 20, 23);
    let mut m = rw(&server, &b, &staging.0, &config);
    std::fs::write(m.p("big.bin"), &big).unwrap();
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    assert!(server.get(&b, "big.bin").unwrap() == big, "{log}");
    // A checkpoint-sized upload is logged at info.
    assert!(
        log.lines()
            .any(|l| l.contains(" INFO ") && l.contains("uploaded") && l.contains("big.bin")),
        "{log}"
    );
    assert!(!log.contains("copied into the data cache"), "{log}");
    let left: Vec<String> = std::fs::read_dir(&staging.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".data") || n.ends_with(".uploaded"))
        .collect();
    assert!(left.is_empty(), "left in staging: {left:?}\n{log}");
    let gets = server.request_count("GetObject");
    let m = MountSpec::new(&b).server(&server).config(&config).mount();
    assert!(std::fs::read(m.p("big.bin")).unwrap() == big);
    assert_eq!(
        server.request_count("GetObject"),
        gets,
        "read from S3, not the cache:\n{log}"
    );
}

/// A reader holding a written file open by passthrough across its upload
/// keeps reading it, and meanwhile an O_TRUNC open or a truncate of that
/// file is ETXTBSY and changes nothing, in S3 or on the mount. Once the
/// reader closes, the same open works.
#[test]
fn changes_wait_for_a_passthrough_reader_of_an_uploaded_file() {
    let b = bucket("w-pt-reader");
    let staging = TempDir::new("staging");
    let m = rw(server(), &b, &staging.0, "");
    let body = data(3 << 20, 31);
    std::fs::write(m.p("f.bin"), &body).unwrap();
    let reader = std::fs::File::open(m.p("f.bin")).unwrap();
    wait_uploaded(server(), &b, "f.bin", &body, &m);
    let handed_over = wait_for(Duration::from_secs(30), || staged(&staging.0).is_empty());
    assert!(handed_over.is_some(), "still staged:\n{}", m.log());
    let r = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("f.bin"));
    assert_errno(r.map(drop), libc::ETXTBSY, "O_TRUNC open beside the reader");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("f.bin"))
        .and_then(|f| f.set_len(0));
    assert_errno(r, libc::ETXTBSY, "open for writing beside the reader");
    let r = nix_truncate(&m.p("f.bin"), 0);
    assert_errno(r, libc::ETXTBSY, "truncate beside the reader");
    let mut got = vec![0u8; body.len()];
    reader.read_exact_at(&mut got, 0).unwrap();
    assert!(got == body, "the reader's bytes changed");
    assert!(server().get(&b, "f.bin").unwrap()[..] == body[..]);
    assert!(std::fs::read(m.p("f.bin")).unwrap() == body);
    drop(reader);
    // The kernel sends the readers' RELEASE after close returns.
    let mut opened = None;
    wait_for(Duration::from_secs(10), || {
        opened = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(m.p("f.bin"))
            .ok();
        opened.is_some()
    });
    let mut f = opened.expect("still busy 10 s after the readers closed");
    f.write_all(b"new").unwrap();
    f.sync_all().unwrap();
    assert_eq!(server().get(&b, "f.bin").unwrap(), b"new".to_vec());
}

/// truncate(2) of `path` to `len` bytes.
fn nix_truncate(path: &Path, len: i64) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::truncate(c.as_ptr(), len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// In-place changes that keep a passthrough-written file's size are
/// uploaded: a patch right after an object is opened for writing, and a
/// patch between two fsyncs.
#[test]
fn same_size_patches_by_passthrough_are_uploaded() {
    let b = bucket("w-pt-patch");
    let mut want = data(2 << 20, 41);
    server().put(&b, "obj.bin", want.clone());
    let staging = TempDir::new("staging");
    let m = rw(server(), &b, &staging.0, "");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("obj.bin"))
        .unwrap();
    f.write_all_at(b"AB", 10).unwrap();
    want[10..12].copy_from_slice(b"AB");
    drop(f);
    wait_uploaded(server(), &b, "obj.bin", &want, &m);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("obj.bin"))
        .unwrap();
    f.write_all_at(b"CD", 100).unwrap();
    want[100..102].copy_from_slice(b"CD");
    f.sync_all().unwrap();
    assert!(server().get(&b, "obj.bin").unwrap()[..] == want[..]);
    f.write_all_at(b"EF", 100).unwrap();
    want[100..102].copy_from_slice(b"EF");
    f.sync_all().unwrap();
    assert!(server().get(&b, "obj.bin").unwrap()[..] == want[..]);
    drop(f);
}

/// A passthrough-written file that is fsynced and then closed with no
/// write in between is uploaded once, not again after its close.
#[test]
fn write_fsync_close_uploads_once() {
    let (server, b, staging, m) = private_rw("w-once", "[write]\nupload_delay_secs = 0.2\n");
    let body = data(1 << 20, 51);
    let mut f = std::fs::File::create(m.p("shard.distcp")).unwrap();
    f.write_all(&body).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert!(server.get(&b, "shard.distcp").unwrap()[..] == body[..]);
    let gone = wait_for(Duration::from_secs(30), || staged(&staging.0).is_empty());
    assert!(gone.is_some(), "not handed over:\n{}", m.log());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.request_count("PutObject"),
        1,
        "{:?}\n{}",
        server.request_counts(),
        m.log()
    );
}

/// close(2) returns before the kernel sends the handle's RELEASE (in the
/// background, fs/fuse/file.c): a file reopened for writing right after
/// it was read back and closed, or truncated, is not refused as busy with
/// that closed handle (a passthrough open of its staged file, which may be
/// uploaded meanwhile); and read right after its close, while its upload
/// is handed over to S3, it has its new bytes. Four writers at once, so
/// releases queue behind others.
#[test]
fn a_file_reopened_for_writing_right_after_close_is_not_busy() {
    let server = private_server();
    let b = bucket_on(&server, "w-reopen");
    let staging = TempDir::new("staging-reopen");
    let (m, addr) = rw_with_metrics(&server, &b, &staging.0, "");
    std::fs::create_dir(m.p("r")).unwrap();
    let wants: Vec<Vec<u8>> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let path = m.p(&format!("r/f{w}.bin"));
                let m = &m;
                s.spawn(move || {
                    let mut want = Vec::new();
                    for i in 0..60u8 {
                        let mut f = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&path)
                            .unwrap_or_else(|e| {
                                panic!("writer {w}: open {i} to append: {e}\n{}", m.log())
                            });
                        f.write_all(&[i; 1000]).unwrap();
                        want.extend_from_slice(&[i; 1000]);
                        f.sync_all().unwrap();
                        drop(f);
                        // Read back at once, as its upload may be handed
                        // over to S3: the new bytes, never ESTALE.
                        if i % 3 == 1 {
                            let got = std::fs::read(&path);
                            let got = got.unwrap_or_else(|e| {
                                panic!("writer {w}: read {i}: {e}\n{}", m.log())
                            });
                            assert!(got == want, "writer {w}: read {i}: {} bytes", got.len());
                        }
                        if i % 20 == 19 {
                            let f = std::fs::OpenOptions::new().write(true).open(&path);
                            let f = f.unwrap_or_else(|e| {
                                panic!("writer {w}: open {i}: {e}\n{}", m.log())
                            });
                            f.set_len(want.len() as u64).unwrap();
                        }
                    }
                    want
                })
            })
            .collect();
        writers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The opens met closed handles of the kind the grace is for: most of
    // the 240 appends opened with passthrough.
    let opens = metric(&scrape(&addr), "lakemount_write_passthrough_opens_total");
    assert!(opens >= 200.0, "{opens} passthrough write opens");
    for (w, want) in wants.iter().enumerate() {
        let key = format!("r/f{w}.bin");
        assert!(std::fs::read(m.p(&key)).unwrap() == *want, "{key} differs");
        wait_uploaded(&server, &b, &key, want, &m);
    }
}

/// What S3 has no place for is refused with the errno a file system that
/// cannot hold it gives (EPERM; EOPNOTSUPP for extended attributes, as
/// `cp -a` expects), and changes nothing; the daemon says so on one line
/// at debug, not in a multi-line warning per call.
#[test]
fn links_special_files_and_xattrs_are_refused_on_one_log_line() {
    let server = private_server();
    let b = bucket_on(&server, "w-refused");
    let staging = TempDir::new("staging-refused");
    let m = rw(&server, &b, &staging.0, "");
    std::fs::write(m.p("a.txt"), b"a").unwrap();
    let r = std::os::unix::fs::symlink("a.txt", m.p("s"));
    assert_errno(r, libc::EPERM, "symlink");
    let r = std::fs::hard_link(m.p("a.txt"), m.p("h"));
    assert_errno(r, libc::EPERM, "link");
    let fifo = std::ffi::CString::new(m.p("f").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    let rc = unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
    let r = if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    };
    assert_errno(r, libc::EPERM, "mkfifo");
    let path = std::ffi::CString::new(m.p("a.txt").as_os_str().as_encoded_bytes()).unwrap();
    for _ in 0..2 {
        // SAFETY: NUL-terminated name and path, a 1-byte value.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"user.k".as_ptr(),
                b"v".as_ptr().cast(),
                1,
                0,
            )
        };
        let r = if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        assert_errno(r, libc::EOPNOTSUPP, "setxattr");
    }
    let names: Vec<String> = std::fs::read_dir(m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["a.txt".to_string()]);
    let log = m.log();
    assert!(!log.contains("Not Implemented"), "{log}");
    for what in [
        "symlink refused",
        "link refused",
        "mknod refused",
        "setxattr refused",
    ] {
        assert!(log.contains(what), "{what}:\n{log}");
    }
}

/// A staged file unlinked or replaced while open stays the open file:
/// ftruncate and writes through its descriptors change it, fstat (which
/// sends no handle) shows it, futimens sets its time, and none of that
/// brings its old name back or touches the file now at that name. A file
/// still at its name is truncated and uploaded so. With and without
/// passthrough.
#[test]
fn ftruncate_changes_only_the_open_file() {
    use std::os::unix::fs::MetadataExt;
    for passthrough in [false, true] {
        let b = bucket(&format!("w-ftrunc-{passthrough}"));
        for k in ["gone.bin", "moved-over.bin", "kept.bin"] {
            server().put(&b, k, format!("old {k} content").into_bytes());
        }
        let staging = TempDir::new("staging");
        let (m, addr) = rw_with_metrics(
            server(),
            &b,
            &staging.0,
            &format!("[write]\npassthrough = {passthrough}\nupload_delay_secs = 3600\n"),
        );
        let open = |k: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.p(k))
                .unwrap_or_else(|e| panic!("open {k}: {e}\n{}", m.log()))
        };
        // Unlinked while open.
        let gone = open("gone.bin");
        std::fs::remove_file(m.p("gone.bin")).unwrap();
        gone.set_len(3)
            .unwrap_or_else(|e| panic!("ftruncate of an unlinked file: {e}\n{}", m.log()));
        gone.write_all_at(b"!", 3).unwrap();
        assert_eq!(gone.metadata().unwrap().len(), 4, "fstat after ftruncate");
        let mut back = vec![0; 8];
        let n = gone.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..n], b"old!");
        // Replaced by a rename while open: truncated, written, its time set.
        let over = open("moved-over.bin");
        std::fs::write(m.p("new.bin"), b"the new file").unwrap();
        std::fs::rename(m.p("new.bin"), m.p("moved-over.bin")).unwrap();
        over.set_len(1)
            .unwrap_or_else(|e| panic!("ftruncate of a replaced file: {e}\n{}", m.log()));
        over.write_all_at(b"xy", 1).unwrap();
        assert_eq!(over.metadata().unwrap().len(), 3);
        let past = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        over.set_modified(past).unwrap();
        assert_eq!(
            over.metadata().unwrap().mtime(),
            1_000_000_000,
            "{}",
            m.log()
        );
        let now_there = std::fs::metadata(m.p("moved-over.bin")).unwrap();
        assert_ne!(
            now_there.mtime(),
            1_000_000_000,
            "futimens reached the new file"
        );
        assert_eq!(now_there.len(), 12);
        assert_eq!(
            std::fs::read(m.p("moved-over.bin")).unwrap(),
            b"the new file"
        );
        // A staged file unlinked while a reader holds it.
        std::fs::write(m.p("read.bin"), b"staged, then unlinked").unwrap();
        let reader = std::fs::File::open(m.p("read.bin")).unwrap();
        std::fs::remove_file(m.p("read.bin")).unwrap();
        assert_eq!(
            reader.metadata().unwrap().len(),
            21,
            "fstat of a read handle"
        );
        // Still at its name.
        let kept = open("kept.bin");
        kept.set_len(7).unwrap();
        drop((gone, over, kept, reader));
        let mut listed = names(&m.path());
        listed.sort();
        assert_eq!(
            listed,
            vec!["kept.bin", "moved-over.bin"],
            "passthrough {passthrough}"
        );
        let opens = metric(&scrape(&addr), "lakemount_write_passthrough_opens_total");
        assert_eq!(opens > 0.0, passthrough, "passthrough opens: {opens}");
        drop(m); // Unmount uploads what is staged.
        let mut keys = server().keys(&b);
        keys.sort();
        assert_eq!(
            keys,
            vec!["kept.bin", "moved-over.bin"],
            "passthrough {passthrough}"
        );
        assert_eq!(
            &server().get(&b, "moved-over.bin").unwrap()[..],
            b"the new file"
        );
        assert_eq!(&server().get(&b, "kept.bin").unwrap()[..], b"old kep");
    }
}

/// truncate(2) that shrinks an object fetches only the bytes it keeps,
/// and uploads them; one that extends it keeps every byte.
#[test]
fn a_shrinking_truncate_fetches_only_what_it_keeps() {
    let server = private_server();
    let b = bucket_on(&server, "w-shrink");
    let big = data(24 << 20, 31);
    server.put(&b, "big.bin", big.clone());
    server.put(&b, "small.bin", b"0123456789".to_vec());
    let staging = TempDir::new("staging");
    let m = rw(&server, &b, &staging.0, "");
    let before = server.get_body_bytes();
    nix_truncate(&m.p("big.bin"), 1000).unwrap_or_else(|e| panic!("{e}\n{}", m.log()));
    let fetched = server.get_body_bytes() - before;
    assert!(fetched < 4 << 20, "{fetched} bytes fetched to keep 1000");
    assert_eq!(std::fs::metadata(m.p("big.bin")).unwrap().len(), 1000);
    assert_eq!(std::fs::read(m.p("big.bin")).unwrap(), big[..1000]);
    nix_truncate(&m.p("small.bin"), 12).unwrap();
    drop(m); // Unmount uploads what is staged.
    assert_eq!(&server.get(&b, "big.bin").unwrap()[..], &big[..1000]);
    assert_eq!(&server.get(&b, "small.bin").unwrap()[..], b"0123456789\0\0");
}
