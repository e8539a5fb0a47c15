//! In-process S3 server on loopback for lakemount's tests and demo.
//!
//! The S3 protocol (SigV4 authentication, routing, XML, Range parsing) is the real
//! one from the [`s3s`] crate; the storage behind it is a small in-memory map of
//! `key -> (bytes, ETag, Last-Modified)` per bucket, so any key can be stored
//! (`a` together with `a/x`, `a/`, `//`, `a/./b`, `+`, spaces, `%`, non-ASCII,
//! components over 255 bytes) and the ETag is computed once, at PUT.
//!
//! The [`TestServer`] handle also offers hooks for tests: direct storage access
//! without HTTP, per-operation request counters, injected failures and delays.
//!
//! ```no_run
//! let server = lakemount_testserver::TestServer::start_background().unwrap();
//! server.create_bucket("data");
//! let etag = server.put("data", "dir/file.bin", vec![1u8, 2, 3]);
//! println!("{} {etag}", server.endpoint());
//! assert_eq!(server.request_count("GetObject"), 0);
//! ```

#![warn(missing_docs)]

pub mod faults;
mod hooks;
mod multipart;
mod percent;
mod s3impl;
mod storage;
mod tls;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::hooks::{HookAccess, Hooks};
use crate::multipart::Uploads;
use crate::s3impl::MemS3;
use crate::storage::Storage;

/// Access key id the server accepts (SigV4).
pub const ACCESS_KEY: &str = "lakemount-test";
/// Secret access key matching [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "lakemount-test-secret";
/// Region the server reports; clients should sign for it.
pub const REGION: &str = "us-east-1";

/// Handle to a running server. Clones are cheap and share the server; the server
/// stops when [`TestServer::shutdown`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct TestServer {
    inner: Arc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    scheme: &'static str,
    storage: Arc<Storage>,
    hooks: Arc<Hooks>,
    uploads: Arc<Uploads>,
    shutdown: watch::Sender<bool>,
    ca_file: Option<PathBuf>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(p) = &self.ca_file {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Everything a freshly bound server needs before it becomes a [`TestServer`].
struct Launched {
    addr: SocketAddr,
    storage: Arc<Storage>,
    hooks: Arc<Hooks>,
    uploads: Arc<Uploads>,
    shutdown: watch::Sender<bool>,
}

/// Binds `addr` and spawns the accept loop on the current tokio runtime.
async fn launch(addr: SocketAddr, tls: Option<TlsAcceptor>) -> io::Result<Launched> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let storage = Arc::new(Storage::default());
    let hooks = Arc::new(Hooks::default());
    let uploads = Arc::new(Uploads::default());
    let mut builder = S3ServiceBuilder::new(MemS3 {
        storage: storage.clone(),
        hooks: hooks.clone(),
        uploads: uploads.clone(),
    });
    builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    builder.set_access(HookAccess {
        hooks: hooks.clone(),
    });
    let service = builder.build();
    let (shutdown, rx) = watch::channel(false);
    tokio::spawn(accept_loop(listener, service, tls, rx));
    Ok(Launched {
        addr,
        storage,
        hooks,
        uploads,
        shutdown,
    })
}

async fn accept_loop(
    listener: TcpListener,
    service: S3Service,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    // Out of file descriptors and the like: back off briefly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let tls = tls.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let serve = async move {
                let http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(stream).await {
                            let _ = http.serve_connection(TokioIo::new(s), service).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            };
            // On shutdown the connection is dropped, closing the socket.
            tokio::select! {
                () = serve => {}
                () = stopped(&mut stop) => {}
            }
        });
    }
}

/// Resolves once shutdown was requested or every handle is gone.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("endpoint", &self.endpoint())
            .finish_non_exhaustive()
    }
}

impl TestServer {
    fn from_launched(l: Launched, scheme: &'static str, ca_file: Option<PathBuf>) -> Self {
        TestServer {
            inner: Arc::new(Inner {
                addr: l.addr,
                scheme,
                storage: l.storage,
                hooks: l.hooks,
                uploads: l.uploads,
                shutdown: l.shutdown,
                ca_file,
            }),
        }
    }

    /// Starts a plain-http server on `127.0.0.1` (random port), serving on the
    /// current tokio runtime. Must be called inside a tokio runtime; the server
    /// stops when that runtime does (or on [`shutdown`](Self::shutdown)).
    ///
    /// The server only makes progress while that runtime runs: a test that blocks
    /// its thread (e.g. reading a FUSE mount with `std::fs` inside a
    /// current-thread `#[tokio::test]`) would wait forever. Use
    /// [`start_background`](Self::start_background) there.
    pub async fn start() -> io::Result<TestServer> {
        Self::start_on(loopback()).await
    }

    /// Like [`start`](Self::start), on a given address (e.g. a fixed port).
    pub async fn start_on(addr: SocketAddr) -> io::Result<TestServer> {
        let l = launch(addr, None).await?;
        Ok(Self::from_launched(l, "http", None))
    }

    /// Starts a plain-http server on `127.0.0.1` (random port) that owns its own
    /// multi-thread tokio runtime on a background thread, for sync callers (and
    /// for async tests that want the server independent of their runtime).
    pub fn start_background() -> io::Result<TestServer> {
        let l = Self::background(loopback(), None)?;
        Ok(Self::from_launched(l, "http", None))
    }

    /// Starts an https server on `127.0.0.1` (random port) with its own runtime
    /// (like [`start_background`](Self::start_background)). The certificate covers
    /// `127.0.0.1`, `::1` and `localhost` and is signed by a CA generated at start;
    /// the returned path is a PEM file of that CA, removed when the server stops.
    pub fn start_tls_background() -> io::Result<(TestServer, PathBuf)> {
        Self::start_tls_background_on(loopback())
    }

    /// [`start_tls_background`](Self::start_tls_background) on `addr`
    /// (port 0: a random one).
    pub fn start_tls_background_on(addr: SocketAddr) -> io::Result<(TestServer, PathBuf)> {
        let (acceptor, ca_pem) = tls::make_acceptor()?;
        let l = Self::background(addr, Some(acceptor))?;
        let path = std::env::temp_dir().join(format!(
            "lakemount-testserver-ca-{}-{}.pem",
            std::process::id(),
            l.addr.port()
        ));
        // Built first so that the server stops (and the file goes) on error too.
        let server = Self::from_launched(l, "https", Some(path.clone()));
        std::fs::write(&path, ca_pem)?;
        Ok((server, path))
    }

    /// Runs [`launch`] on a new multi-thread runtime owned by a background thread
    /// that lives until shutdown.
    fn background(addr: SocketAddr, tls: Option<TlsAcceptor>) -> io::Result<Launched> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lakemount-testserver")
            .enable_all()
            .build()?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("lakemount-testserver-main".into())
            .spawn(move || {
                rt.block_on(async move {
                    match launch(addr, tls).await {
                        Ok(l) => {
                            let mut stop = l.shutdown.subscribe();
                            let _ = tx.send(Ok(l));
                            // Returns on shutdown, or when the handle (the sender) is gone.
                            stopped(&mut stop).await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })?;
        rx.recv()
            .map_err(|_| io::Error::other("server thread died"))?
    }

    /// Base URL, e.g. `http://127.0.0.1:40123` (`https://` for a TLS server).
    pub fn endpoint(&self) -> String {
        format!("{}://{}", self.inner.scheme, self.inner.addr)
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Creates a bucket directly in storage (no HTTP). Creating an existing
    /// bucket is a no-op.
    pub fn create_bucket(&self, bucket: &str) {
        let _ = self.inner.storage.create_bucket(bucket);
    }

    /// Stores an object directly (no HTTP, not counted) with Last-Modified = now;
    /// returns its quoted ETag. Panics if the bucket does not exist.
    pub fn put(&self, bucket: &str, key: &str, data: impl Into<Bytes>) -> String {
        self.put_with_mtime(bucket, key, data, SystemTime::now())
    }

    /// Like [`put`](Self::put) with a given Last-Modified time.
    pub fn put_with_mtime(
        &self,
        bucket: &str,
        key: &str,
        data: impl Into<Bytes>,
        mtime: SystemTime,
    ) -> String {
        self.inner
            .storage
            .put(bucket, key, data.into(), mtime)
            .unwrap_or_else(|e| panic!("put {bucket}/{key}: {e:?}"))
    }

    /// Removes an object directly (no-op if absent or if the bucket is missing).
    pub fn delete(&self, bucket: &str, key: &str) {
        let _ = self.inner.storage.delete(bucket, key);
    }

    /// Reads an object's content directly, `None` if absent.
    pub fn get(&self, bucket: &str, key: &str) -> Option<Bytes> {
        self.inner.storage.get(bucket, key).ok().map(|o| o.data)
    }

    /// Every key of `bucket`, in order (empty if the bucket is missing).
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        self.inner
            .storage
            .list(bucket, "", None, None, usize::MAX)
            .map(|p| {
                p.entries
                    .into_iter()
                    .filter_map(|e| match e {
                        storage::ListEntry::Object(k, _) => Some(k),
                        storage::ListEntry::CommonPrefix(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Keys of the multipart uploads of `bucket` neither completed nor
    /// aborted, sorted.
    pub fn open_uploads(&self, bucket: &str) -> Vec<String> {
        self.inner
            .uploads
            .list(bucket, "")
            .into_iter()
            .map(|u| u.key)
            .collect()
    }

    /// Quoted ETag of an object, `None` if absent.
    pub fn etag(&self, bucket: &str, key: &str) -> Option<String> {
        self.inner.storage.get(bucket, key).ok().map(|o| o.etag)
    }

    /// Number of HTTP requests of operation `op` served since start or the last
    /// [`reset_counts`](Self::reset_counts). `op` is the S3 operation name as s3s
    /// and AWS spell it: `"ListObjectsV2"`, `"HeadObject"`, `"GetObject"`,
    /// `"PutObject"`, `"HeadBucket"`, `"ListBuckets"`, ... Every request that passed
    /// routing and the signature check counts, including those that then failed
    /// (missing key, injected failure, precondition).
    pub fn request_count(&self, op: &str) -> u64 {
        self.inner.hooks.count(op)
    }

    /// All request counters: (operation, requests), sorted by operation.
    pub fn request_counts(&self) -> Vec<(String, u64)> {
        self.inner.hooks.counts()
    }

    /// Sets all request counters to zero.
    pub fn reset_counts(&self) {
        self.inner.hooks.reset_counts();
    }

    /// Makes the next `times` requests of `op` fail with HTTP `status` and the
    /// matching S3 error code (503 SlowDown, 500 InternalError, 403 AccessDenied,
    /// 404 NoSuchKey, 400 InvalidRequest, 412 PreconditionFailed, other statuses
    /// InjectedError). `times == 0` cancels. Replaces an earlier setting for `op`.
    pub fn fail_next(&self, op: &str, status: u16, times: u32) {
        self.inner.hooks.fail_next(op, status, times);
    }

    /// The next `times` GetObject bodies of keys starting with `key_prefix`
    /// send their first `after` bytes (of the range asked for) and then fail
    /// the connection (`stall` false: the client sees a short body) or send
    /// nothing more while keeping it open (`stall` true). Headers announce
    /// the whole length either way. `times == 0` removes the rule.
    pub fn break_bodies(&self, key_prefix: &str, after: usize, stall: bool, times: u32) {
        self.inner
            .hooks
            .break_bodies(key_prefix, after, stall, times);
    }

    /// From now on requests signed for another region than `region` are
    /// refused with 400 AuthorizationHeaderMalformed naming the region
    /// expected, as strict servers do; `None` (the default): any region.
    pub fn require_region(&self, region: Option<&str>) {
        self.inner.hooks.require_region(region);
    }

    /// The next `times` requests of `op` are carried out and then answered
    /// 500, as if their answers were lost (CreateMultipartUpload only).
    pub fn lose_answers(&self, op: &str, times: u32) {
        self.inner.hooks.lose_answers(op, times);
    }

    /// GetObject body bytes sent since the last [`Self::reset_counts`]; of a
    /// body broken by [`Self::break_bodies`], the bytes before the break.
    pub fn get_body_bytes(&self) -> u64 {
        self.inner.hooks.body_bytes()
    }

    /// (key, Range header) of every GetObject since the last
    /// [`Self::reset_counts`], in arrival order.
    pub fn get_ranges(&self) -> Vec<(String, Option<String>)> {
        self.inner.hooks.get_ranges()
    }

    /// From now on the first `times` requests of every key fail with HTTP
    /// `status` (as [`Self::fail_next`]), whatever the operation; a
    /// listing's key is its `prefix` parameter. `times == 0` turns it off.
    pub fn fail_first_per_key(&self, status: u16, times: u32) {
        self.inner.hooks.fail_first_per_key(status, times);
    }

    /// The first `times` requests of each key are answered `delay` late,
    /// as by a server that holds a request (other requests go on); 0
    /// times: none from now on. Replaces [`Self::fail_first_per_key`].
    pub fn hold_first_per_key(&self, delay: Duration, times: u32) {
        self.inner.hooks.hold_first_per_key(delay, times);
    }

    /// Sends every GetObject body at most `bytes_per_sec` in all, bodies
    /// sharing the rate as on one link (the rest of the request is not
    /// slowed); 0 turns it off.
    pub fn set_body_rate(&self, bytes_per_sec: u64) {
        self.inner.hooks.set_body_rate(bytes_per_sec);
    }

    /// Requests of `op` on keys starting with `key_prefix` sleep `delay` (without
    /// blocking other requests) before being answered. For bucket-level operations
    /// such as `ListObjectsV2` the key is the request's `prefix` parameter ("" if
    /// none). `op` `"GetObjectBody"` delays the first byte of GetObject
    /// bodies instead, after headers sent at once (not for a key whose body
    /// is broken by [`Self::break_bodies`], nor while a body rate is set).
    /// A zero `delay` removes the rule for this `(op, key_prefix)`.
    pub fn set_delay(&self, op: &str, key_prefix: &str, delay: Duration) {
        self.inner.hooks.set_delay(op, key_prefix, delay);
    }

    /// How listings treat `encoding-type=url` from now on: `"honour"` (the
    /// default; keys %-encoded, EncodingType echoed), `"ignore"` (raw keys, no
    /// EncodingType in the answer) or `"reject"` (400 InvalidArgument).
    /// Panics on another value.
    pub fn set_list_encoding(&self, mode: &str) {
        let v = match mode {
            "honour" => 0,
            "ignore" => 1,
            "reject" => 2,
            other => panic!("set_list_encoding: unknown mode {other:?}"),
        };
        self.inner
            .hooks
            .encoding_mode
            .store(v, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stops accepting connections and drops open ones (shortly after the call
    /// returns: it does not wait). Every clone of the handle sees the server stop.
    pub fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
    }
}
