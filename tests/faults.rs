//! Reads through the fault-injecting proxy (testserver/src/faults.rs) in
//! front of the test server: every kind of fault, at a rate of 10% and more,
//! gives byte-exact data and no failed read.

mod common;

use std::time::Duration;

use common::*;
use lakemount_testserver::faults::{Fault, FaultPlan, FaultProxy};

/// For each kind of fault alone, then all kinds mixed: a fresh directory of
/// small files and a larger file, read by 4 threads through a mount whose
/// endpoint is the proxy. Every byte must match and no read may fail.
#[test]
fn every_kind_of_fault_at_ten_percent_reads_byte_exact() {
    let srv = private_server();
    let b = bucket_on(&srv, "faults");
    let mut rounds: Vec<(String, Vec<Fault>)> = Fault::ALL
        .iter()
        .map(|f| (f.name().to_string(), vec![*f]))
        .collect();
    rounds.push(("mixed".into(), Fault::ALL.to_vec()));
    let files = |dir: &str| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = (0..40)
            .map(|i| {
                (
                    format!("{dir}/s{i:02}"),
                    data(3_000 + i * 211, i as u64 + 7),
                )
            })
            .collect();
        v.push((format!("{dir}/big"), data((3 << 20) + 123, 99)));
        v
    };
    for (dir, _) in &rounds {
        for (k, d) in files(dir) {
            srv.put(&b, &k, d);
        }
    }
    let proxy = FaultProxy::start(srv.addr(), FaultPlan::every_kind(0.0, 11)).unwrap();
    // A stall is cut after 1 s without a byte, and 6 attempts cover a run
    // of faults on one request.
    let m = MountSpec::new(&b)
        .server(&srv)
        .env("LAKEMOUNT_ENDPOINT_URL", &proxy.endpoint())
        .config("[s3]\nstall_timeout_secs = 1.0\nmax_attempts = 6\n")
        .mount();
    for (dir, kinds) in &rounds {
        proxy.set_plan(FaultPlan {
            rate: 0.1,
            kinds: kinds.clone(),
            seed: 11,
            stall: Duration::from_secs(4),
            slow: Duration::from_millis(500),
        });
        let before = proxy.injected();
        let want = files(dir);
        let failures = read_all_4(&m, &want);
        proxy.set_rate(0.0);
        let injected: u64 = proxy
            .injected()
            .iter()
            .map(|(f, n)| n - before.iter().find(|(g, _)| g == f).map_or(0, |(_, n)| *n))
            .sum();
        assert!(
            failures.is_empty(),
            "{dir}: {} of {} reads failed with {injected} faults injected: {failures:?}\n{}",
            failures.len(),
            want.len(),
            m.log()
        );
        assert!(injected > 0, "{dir}: no fault was injected");
    }
}

/// A ListObjectsV2 answer cut short (a chunked body that ends early, well
/// formed so far) is never taken as a shorter directory: while every answer
/// is cut, `ls` fails with EIO; once they are whole, every name is there.
#[test]
fn a_listing_cut_short_is_eio_never_a_shorter_directory() {
    let srv = private_server();
    let b = bucket_on(&srv, "cutlist");
    for i in 0..300 {
        srv.put(&b, &format!("d/file-{i:03}"), "x");
    }
    let proxy = FaultProxy::start(srv.addr(), FaultPlan::every_kind(0.0, 5)).unwrap();
    let m = MountSpec::new(&b)
        .server(&srv)
        .env("LAKEMOUNT_ENDPOINT_URL", &proxy.endpoint())
        .config("[s3]\nmax_attempts = 2\n")
        .mount();
    proxy.set_plan(FaultPlan {
        rate: 1.0,
        kinds: vec![Fault::TruncatedBody],
        ..FaultPlan::every_kind(1.0, 5)
    });
    let err = std::fs::read_dir(m.p("d")).map(|d| d.count()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    proxy.set_rate(0.0);
    assert_eq!(names(&m.p("d")).len(), 300);
}
