//! `lakemount-faultproxy`: the fault-injecting proxy of
//! [`lakemount_testserver::faults`] as a command, for benchmarks in front of
//! any S3 server (bench/faults.sh).
//!
//! ```text
//! lakemount-faultproxy --upstream HOST:PORT [--port N] [--rate 0.1] [--seed 1]
//!                      [--kinds all|500,503,...] [--stall-ms 20000] [--slow-ms 2000]
//! ```
//!
//! Prints `endpoint=http://127.0.0.1:PORT` once listening, and at SIGINT or
//! SIGTERM one line per fault kind injected (`injected KIND N`) and
//! `requests N`, then exits.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use lakemount_testserver::faults::{Fault, FaultPlan, FaultProxy};

const USAGE: &str = "usage: lakemount-faultproxy --upstream HOST:PORT [--port N] [--rate 0.1] \
                     [--seed 1] [--kinds all|500,503,reset_before,...] [--stall-ms 20000] \
                     [--slow-ms 2000]";

fn main() {
    if let Err(e) = run() {
        eprintln!("lakemount-faultproxy: {e}\n{USAGE}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut upstream: Option<SocketAddr> = None;
    let mut port = 0u16;
    let mut plan = FaultPlan::every_kind(0.1, 1);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--upstream" => {
                let v = value()?;
                upstream = v
                    .to_socket_addrs()
                    .map_err(|e| format!("--upstream {v}: {e}"))?
                    .next();
            }
            "--port" => port = num(&flag, &value()?)?,
            "--rate" => plan.rate = num(&flag, &value()?)?,
            "--seed" => plan.seed = num(&flag, &value()?)?,
            "--stall-ms" => plan.stall = Duration::from_millis(num(&flag, &value()?)?),
            "--slow-ms" => plan.slow = Duration::from_millis(num(&flag, &value()?)?),
            "--kinds" => {
                let v = value()?;
                if v != "all" {
                    plan.kinds = v
                        .split(',')
                        .map(|k| {
                            Fault::ALL
                                .into_iter()
                                .find(|f| f.name() == k.trim())
                                .ok_or(format!("--kinds: unknown kind {k:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let upstream = upstream.ok_or("--upstream is required")?;
    if !(0.0..=1.0).contains(&plan.rate) {
        return Err(format!("--rate {}: accepted 0 to 1", plan.rate));
    }
    let proxy = FaultProxy::start_on(SocketAddr::from(([127, 0, 0, 1], port)), upstream, plan)
        .map_err(|e| format!("cannot listen: {e}"))?;
    println!("endpoint={}", proxy.endpoint());
    wait_for_signal();
    for (f, n) in proxy.injected() {
        println!("injected {} {n}", f.name());
    }
    println!("requests {}", proxy.requests());
    Ok(())
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag} {v}: not a number"))
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the signal wait");
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
}
