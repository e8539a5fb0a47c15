//! First end-to-end check: mount, list, read, unmount on SIGTERM.

mod common;

use common::*;

#[test]
fn mount_list_read_unmount() {
    let b = bucket("smoke");
    let s = server();
    s.put(&b, "hello.txt", "hello lakemount\n");
    s.put(&b, "dir/sub/x.bin", data(100_000, 1));
    let mut m = Mount::new(&b, &[]);
    assert_eq!(names(&m.path()), ["dir", "hello.txt"]);
    assert_eq!(
        std::fs::read(m.p("hello.txt")).unwrap(),
        b"hello lakemount\n"
    );
    assert_eq!(
        std::fs::read(m.p("dir/sub/x.bin")).unwrap(),
        data(100_000, 1)
    );
    let (status, log) = m.stop();
    assert!(status.success(), "exit {status}:\n{log}");
    assert!(!is_mounted(&m.path()), "still mounted after SIGTERM");
    assert!(
        log.contains("lakemount_s3_requests_total"),
        "no request summary in log:\n{log}"
    );
}
