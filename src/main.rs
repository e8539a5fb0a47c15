use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use lakemount::cli::{Cli, Command};

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match argv.first() {
        // A daemon child re-executed from a copy named mount.lakemount gets
        // the translated arguments already.
        Some(a0) if lakemount::fstab::is_helper(a0) && !lakemount::daemon::is_child() => {
            match helper(&argv) {
                Ok(Some(args)) => args,
                Ok(None) => return ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{}: {e}", lakemount::fstab::HELPER_NAME);
                    // mount(8)'s exit status for a usage error.
                    return ExitCode::from(1);
                }
            }
        }
        _ => argv,
    };
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            let note = env_source_note(&e);
            let _ = e.print();
            if let Some(note) = note {
                eprintln!("note: {note}");
            }
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
    };
    let result = match &cli.command {
        Command::Mount(args) => lakemount::app::run_mount(args),
        Command::Warm(args) => lakemount::warm::run_warm(args).map(|_| ()),
        Command::Stats(args) => lakemount::stats::run_stats(args),
        Command::Doctor(args) => lakemount::doctor::run_doctor(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A daemon child's parent prints the reason it was sent; one that
            // failed before sending any (bad log filter, a race on the mount
            // point) prints it on the stderr it shares with the parent.
            if !(lakemount::daemon::shares_parent_stderr() && lakemount::daemon::message_sent()) {
                eprintln!("lakemount: error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

/// `mount.lakemount` (run by mount(8)): the `lakemount mount` arguments, or
/// `None` for `-f` (nothing to mount). Creates the default log directory.
fn helper(argv: &[std::ffi::OsString]) -> Result<Option<Vec<std::ffi::OsString>>, String> {
    let h = lakemount::fstab::translate(argv)?;
    for o in &h.ignored {
        eprintln!(
            "{}: ignoring unknown option {o:?} (-s)",
            lakemount::fstab::HELPER_NAME
        );
    }
    if h.fake || h.verbose {
        let cmd: Vec<String> = h
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        eprintln!("{}: {}", lakemount::fstab::HELPER_NAME, cmd.join(" "));
    }
    if h.fake {
        return Ok(None);
    }
    let _ = std::fs::create_dir_all(lakemount::fstab::DEFAULT_LOG_DIR);
    set_home_if_unset();
    lakemount::daemon::set_command_line(h.args.clone());
    Ok(Some(h.args))
}

/// mount(8) runs helpers with a bare environment (no `HOME`), so the AWS
/// profile files (`~/.aws/credentials`, `~/.aws/config`) would not be found:
/// `HOME` is set from the user's passwd entry (getpwuid(3)) when unset.
fn set_home_if_unset() {
    if std::env::var_os("HOME").is_some() {
        return;
    }
    // SAFETY: getpwuid returns a pointer to static storage or null; the
    // directory is copied out before any other passwd call.
    let dir = unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() || (*pw).pw_dir.is_null() {
            return;
        }
        std::ffi::CStr::from_ptr((*pw).pw_dir).to_owned()
    };
    let dir: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(dir.into_bytes());
    // SAFETY: the helper has started no thread yet (this runs before the
    // runtime and before any daemon child), so nothing reads the
    // environment concurrently.
    unsafe { std::env::set_var("HOME", dir) };
}

/// For a bad value that came from an environment variable rather than the
/// command line, names the variable and the config key it stands for: clap's
/// own message names only the flag (`--metadata-ttl <SECS>`), which the admin
/// never typed.
fn env_source_note(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let (flag, flag_eq) = (format!("--{long}"), format!("--{long}="));
    let typed = std::env::args_os().any(|a| {
        let a = a.as_encoded_bytes();
        a == flag.as_bytes() || a.starts_with(flag_eq.as_bytes())
    });
    if typed {
        return None;
    }
    let cmd = Cli::command();
    let found = cmd
        .get_subcommands()
        .flat_map(|s| s.get_arguments())
        .chain(cmd.get_arguments())
        .find(|a| a.get_long() == Some(long))?;
    let var = found.get_env()?.to_string_lossy().into_owned();
    std::env::var_os(&var)?;
    // The help text names the config key in brackets, e.g. "[metadata.ttl_secs]".
    let help = found.get_help().map(|h| h.to_string()).unwrap_or_default();
    let key = help
        .rsplit_once('[')
        .and_then(|(_, k)| k.split_once(']'))
        .map(|(k, _)| k)
        .filter(|k| k.contains('.') && !k.contains(' '));
    Some(match key {
        Some(key) => format!("the value came from environment variable {var} (config key {key})"),
        None => format!("the value came from environment variable {var}"),
    })
}

/// jemalloc instead of glibc malloc. Read-ahead allocates and frees
/// part-sized buffers (up to `read.part_size`, 8 MiB) from several threads at
/// GiB/s; glibc kept ~150 MiB more resident than jemalloc for the same bytes in
/// use (200 open files read at once, 1,504 MiB budget, 2026-12-01: peak RSS
/// 1,810 vs 1,674 MiB; docs/OPERATIONS.md, "Memory").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options, read at its start (`malloc_conf`, jemalloc(3), under the
/// `_rjem_` prefix tikv-jemallocator builds it with; the `_RJEM_MALLOC_CONF`
/// environment variable still overrides them). `dirty_decay_ms:100`: freed
/// pages go back to the kernel ~0.1 s after they are freed (applied on later
/// allocator calls; no background thread) instead of ~10 s. With 200 open
/// files read at once with direct I/O (1,504 MiB budget, probe runs of
/// 2026-12-01, docs/READAHEAD.md): 10 s: peak RSS 1,813-1,862 MiB against
/// ~1,507 MiB reserved (the gap is an upper bound of the freed pages kept:
/// it also holds the idle daemon and pooled buffers); 100 ms: 1,578-1,632
/// MiB at 930-980 MiB/s (10 s: 970-980, ~4% more); 0 ms: 1,350-1,441 MiB but
/// 630-810 MiB/s (every buffer faulted in anew). `muzzy_decay_ms:0` is
/// jemalloc 5.3's default, stated so it stays.
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf = MallocConf(c"dirty_decay_ms:100,muzzy_decay_ms:0".as_ptr());

/// A C string pointer that may sit in a `static` (jemalloc reads it, never
/// writes it).
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a 'static, immutable C string literal.
unsafe impl Sync for MallocConf {}
