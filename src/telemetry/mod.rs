//! Tracing setup and metrics. Metric names live in [`metrics`] as constants.

pub mod control;
pub mod metrics;
pub mod stats;

use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber writing to stderr. `RUST_LOG`, when
/// set, wins over `level` (e.g. `info`, `lakemount=debug,fuser=warn`).
/// Errors: an unparsable filter string.
pub fn init_logging(level: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v)?,
        // fuser warns on every clean unmount ("Failed to umount ... EINVAL",
        // its second unmount of an already unmounted path): keep its errors only.
        // The AWS credential chain warns, in long lines, for every source it
        // tries and misses; the mount's own error names what was looked for.
        // Its info lines name the access key ID of the profile it loads.
        // At debug and trace those lines are what one is looking for: kept.
        _ if !level.contains('=') => EnvFilter::try_new(match level {
            "info" => {
                "info,fuser::session=error,aws_config=warn,aws_config::meta::credentials=error"
                    .to_string()
            }
            "warn" | "error" => {
                format!("{level},fuser::session=error,aws_config::meta::credentials=error")
            }
            _ => format!("{level},fuser::session=error"),
        })
        .map_err(|e| anyhow::anyhow!("telemetry.log_level: bad value {level:?}: {e}"))?,
        _ => EnvFilter::try_new(level)
            .map_err(|e| anyhow::anyhow!("telemetry.log_level: bad value {level:?}: {e}"))?,
    };
    // A second init (tests, daemon child) is harmless: keep the first.
    // Colour codes only on a terminal, never into a --log-file or journald.
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
    Ok(())
}
