//! The `ingest` binary: parse the command line and run it. The CLI is glue:
//! every command runs against the engine (`ingest-engine`) or a server
//! (`ingest-client`) through one [`cli::backend::Backend`].

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use cli::Cli;
use ingest_config::GlobalOverrides;

mod cli;

/// mimalloc rather than glibc's allocator: sled allocates and frees a small
/// buffer for almost every page it touches, and under replicated load
/// `malloc`, `_int_malloc` and `free` were the engines' writer threads'
/// largest costs (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // What `serve` and `worker` were told on their command line or in their
    // environment wins over their configuration file; clap's defaults do not.
    if let (cli::Cmd::Serve(args), Some(("serve", sub))) = (&mut cli.command, matches.subcommand())
    {
        args.given = sub
            .ids()
            .filter(|id| {
                sub.value_source(id.as_str())
                    .is_some_and(|s| s != ValueSource::DefaultValue)
            })
            .map(|id| id.as_str().to_string())
            .collect();
    }
    // `serve` reads a configuration file that may set these; only options the
    // user gave (flag or environment) override it, not clap's defaults.
    let given = |id: &str| {
        matches
            .value_source(id)
            .is_some_and(|s| s != ValueSource::DefaultValue)
    };
    let globals = GlobalOverrides {
        data_dir: given("data_dir").then(|| cli.data_dir.clone()),
        lifecycle: cli.states.clone(),
        log_format: given("log_format").then_some(cli.log_format),
    };
    match cli::run_with(cli, globals) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(cli::exit::code_of(&e));
        }
    }
}
