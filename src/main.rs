//! The `ingest` binary: parse the command line and run it.

use clap::Parser;

fn main() {
    let cli = ingest::cli::Cli::parse();
    ingest::init_tracing(cli.log_format);
    match ingest::cli::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
