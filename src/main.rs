use std::process::ExitCode;

use clap::Parser;
use lakemount::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Mount(args) => lakemount::app::run_mount(args),
        Command::Warm(args) => lakemount::warm::run_warm(args).map(|_| ()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lakemount: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
