//! `mount.lakemount`: the helper mount(8) runs for an `/etc/fstab` line of
//! type `lakemount` (and systemd's mount units generated from it):
//!
//! ```text
//! s3://training-data/imagenet  /mnt/ai-data  lakemount  _netdev,nofail,allow_other,config=/etc/lakemount/ai-data.toml  0 0
//! ```
//!
//! mount(8) calls `/sbin/mount.lakemount SOURCE DIR [-sfnvrw] [-o OPTIONS]`
//! (a symlink to the lakemount binary); [`translate`] turns that into
//! `lakemount mount SOURCE DIR --daemon ...`, which returns once the mount
//! answers. The option names are in docs/ADMIN.md ("fstab").

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// The name mount(8) runs for file system type `lakemount`.
pub const HELPER_NAME: &str = "mount.lakemount";

/// Directory of the daemon's log when the options name no `log_file`.
pub const DEFAULT_LOG_DIR: &str = "/var/log/lakemount";

/// Options of mount(8) and systemd that are not the file system's: accepted
/// and ignored. (`rw` too: mount(8) passes it to every helper unless `ro` was
/// asked, so it cannot mean "writable"; `read_write` does.)
const IGNORED: &[&str] = &[
    "rw",
    "defaults",
    "auto",
    "noauto",
    "nofail",
    "_netdev",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "async",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "diratime",
    "nodiratime",
];

/// `name=VALUE` options that become `--name VALUE` of `lakemount mount`.
const FLAGS: &[(&str, &str)] = &[
    ("config", "--config"),
    ("endpoint_url", "--endpoint-url"),
    ("region", "--region"),
    ("profile", "--profile"),
    ("ca_bundle", "--ca-bundle"),
    ("cache_dir", "--cache-dir"),
    ("cache_max_size", "--cache-max-size"),
    ("metadata_ttl", "--metadata-ttl"),
    ("staging_dir", "--staging-dir"),
    ("metrics_addr", "--metrics-addr"),
    ("log_level", "--log-level"),
    ("log_file", "--log-file"),
];

/// Options passed on as `-o` (lakemount's own mount options).
const MOUNT_OPTIONS: &[&str] = &["ro", "allow_other", "uid", "gid", "file_mode", "dir_mode"];

/// What the helper is to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Helper {
    /// `lakemount mount ...` arguments (`argv[0]` included).
    pub args: Vec<OsString>,
    /// `-f`: print the command, mount nothing.
    pub fake: bool,
    /// `-v`: print the command, then mount.
    pub verbose: bool,
    /// Options ignored because of `-s` (sloppy), for a warning.
    pub ignored: Vec<String>,
}

/// Whether this process was started as the helper (by its `argv[0]`).
pub fn is_helper(argv0: &OsStr) -> bool {
    Path::new(argv0).file_name() == Some(OsStr::new(HELPER_NAME))
}

/// Translates the helper's arguments (`argv[0]` included) into those of
/// `lakemount mount`. Errors: a missing source or directory, an unknown
/// option without `-s`, `-N` (mount namespaces are not supported).
pub fn translate(argv: &[OsString]) -> Result<Helper, String> {
    let mut positional = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let (mut fake, mut verbose, mut sloppy) = (false, false, false);
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => {
                let v = it.next().ok_or("-o needs a value")?;
                options.extend(split_options(&v.to_string_lossy()));
            }
            "-t" => {
                it.next().ok_or("-t needs a value")?;
            }
            "-N" | "--namespace" => return Err("-N (mount namespaces) is not supported".into()),
            flags if flags.starts_with('-') && flags.len() > 1 && !flags.starts_with("--") => {
                for c in flags[1..].chars() {
                    match c {
                        'f' => fake = true,
                        'v' => verbose = true,
                        's' => sloppy = true,
                        'r' => options.push("ro".into()),
                        'n' | 'w' => {}
                        _ => return Err(format!("unknown flag -{c}")),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] = positional.as_slice() else {
        return Err(format!(
            "usage: {HELPER_NAME} s3://BUCKET[/PREFIX] DIR [-sfnv] [-o OPTIONS] (got {} operands)",
            positional.len()
        ));
    };
    let mut args: Vec<OsString> = vec!["lakemount".into(), "mount".into()];
    args.push(source.clone());
    args.push(dir.clone());
    args.push("--daemon".into());
    let mut mount_opts = Vec::new();
    let mut ignored = Vec::new();
    let mut log_file = false;
    for opt in options {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.as_str(), None),
        };
        if IGNORED.contains(&name) || name.starts_with("x-") || name == "comment" {
            continue;
        }
        if name == "read_write" && value.is_none() {
            args.push("--read-write".into());
        } else if let Some((_, flag)) = FLAGS.iter().find(|(n, _)| *n == name) {
            let v = value.ok_or_else(|| format!("option {name} needs a value ({name}=...)"))?;
            log_file |= name == "log_file";
            args.push((*flag).into());
            args.push(v.into());
        } else if MOUNT_OPTIONS.contains(&name) || (name.contains('.') && value.is_some()) {
            mount_opts.push(opt.clone());
        } else if sloppy {
            ignored.push(opt.clone());
        } else {
            return Err(format!(
                "unknown option {opt:?}; accepted: read_write, ro, allow_other, uid=, gid=, \
                 file_mode=, dir_mode=, {}, and any config key as SECTION.KEY=VALUE",
                FLAGS
                    .iter()
                    .map(|(n, _)| format!("{n}="))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    // `mount -o ro` (or -r) over an fstab line with read_write: ro wins.
    if mount_opts.iter().any(|o| o == "ro") {
        args.retain(|a| a != "--read-write");
    }
    if !mount_opts.is_empty() {
        args.push("-o".into());
        args.push(mount_opts.join(",").into());
    }
    if !log_file {
        let name = crate::telemetry::control::escape(
            &std::path::absolute(Path::new(dir)).unwrap_or_else(|_| Path::new(dir).to_path_buf()),
        );
        args.push("--log-file".into());
        args.push(format!("{DEFAULT_LOG_DIR}/{name}.log").into());
    }
    Ok(Helper {
        args,
        fake,
        verbose,
        ignored,
    })
}

/// Splits an option string at commas outside double quotes (a value such as
/// `comment="a,b"`); the quotes are removed.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out.retain(|o| !o.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(args: &[&str]) -> Result<Vec<String>, String> {
        let argv: Vec<OsString> = std::iter::once("/sbin/mount.lakemount")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        translate(&argv).map(|h| {
            h.args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn an_fstab_line_becomes_a_daemon_mount() {
        let a = t(&[
            "s3://bkt/x",
            "/mnt/ai-data",
            "-o",
            "rw,allow_other,cache_dir=/nvme/c,cache.max_size=100GiB,_netdev,nofail",
        ])
        .unwrap();
        assert_eq!(
            a,
            [
                "lakemount",
                "mount",
                "s3://bkt/x",
                "/mnt/ai-data",
                "--daemon",
                "--cache-dir",
                "/nvme/c",
                "-o",
                "allow_other,cache.max_size=100GiB",
                "--log-file",
                "/var/log/lakemount/mnt-ai\\x2ddata.log",
            ]
        );
    }

    #[test]
    fn rw_from_mount8_does_not_make_it_writable() {
        let a = t(&["s3://bkt", "/m", "-o", "rw"]).unwrap();
        assert!(!a.contains(&"--read-write".to_string()), "{a:?}");
        let a = t(&["s3://bkt", "/m", "-o", "rw,read_write,log_file=/l"]).unwrap();
        assert!(a.contains(&"--read-write".to_string()), "{a:?}");
        assert_eq!(a[a.len() - 2..], ["--log-file", "/l"]);
        let a = t(&["s3://bkt", "/m", "-r"]).unwrap();
        assert_eq!(a[5..7], ["-o", "ro"]);
        let a = t(&["s3://bkt", "/m", "-o", "read_write,ro"]).unwrap();
        assert!(!a.contains(&"--read-write".to_string()), "{a:?}");
    }

    #[test]
    fn unknown_options_are_errors_unless_sloppy() {
        let e = t(&["s3://bkt", "/m", "-o", "frobnicate"]).unwrap_err();
        assert!(e.contains("unknown option \"frobnicate\""), "{e}");
        let argv: Vec<OsString> = [
            "mount.lakemount",
            "s3://bkt",
            "/m",
            "-s",
            "-o",
            "frobnicate",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        assert_eq!(translate(&argv).unwrap().ignored, ["frobnicate"]);
        assert!(t(&["s3://bkt"]).unwrap_err().contains("usage"));
        assert!(
            t(&["s3://bkt", "/m", "-o", "config"])
                .unwrap_err()
                .contains("needs a value")
        );
    }

    #[test]
    fn quoted_commas_stay_in_their_option() {
        assert_eq!(
            split_options("a,comment=\"x,y\",b"),
            ["a", "comment=x,y", "b"]
        );
        assert!(is_helper(OsStr::new("/usr/sbin/mount.lakemount")));
        assert!(!is_helper(OsStr::new("lakemount")));
    }
}
