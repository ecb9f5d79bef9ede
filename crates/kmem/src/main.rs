//! `kmem`: runs kmem's benchmark suites beside the seeds' published figures.
//!
//! ```text
//!   kmem                          same as `kmem report`
//!   kmem report [--smoke|--full] [--out DIR] [--only a,b]
//!   kmem bench SUITE [--full|--smoke] [--json] [--threads N] [--cpus N]
//!   kmem bench --list
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use kmem::output::{MachineJson, Scale};
use kmem::{report, suites};

#[derive(Parser)]
#[command(
    name = "kmem",
    version,
    about = "kmem allocators: benchmark suites beside the seeds' published figures"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every suite, print the tables and write the HTML report (the default).
    Report(ReportArgs),
    /// Run one suite.
    Bench(BenchArgs),
}

#[derive(Args, Default)]
struct ReportArgs {
    /// Tiny scale for CI: every case, seconds in all.
    #[arg(long, conflicts_with = "full")]
    smoke: bool,
    /// The seeds' own scale (slow).
    #[arg(long)]
    full: bool,
    /// Output directory (default: target/kmem-report of the workspace).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these suites (comma separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

#[derive(Args)]
struct BenchArgs {
    /// Suite name (see --list).
    suite: Option<String>,
    /// List the suites.
    #[arg(long)]
    list: bool,
    /// The seed's own scale.
    #[arg(long, conflicts_with = "smoke")]
    full: bool,
    /// Tiny scale.
    #[arg(long)]
    smoke: bool,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// Threads, for suites that take a thread count (at least 1).
    #[arg(long, value_parser = at_least_one)]
    threads: Option<usize>,
    /// Simulated CPUs, for suites on a simulated topology (at least 1).
    #[arg(long, value_parser = at_least_one)]
    cpus: Option<usize>,
}

/// A count of threads or CPUs: 0 is refused with a message, not clamped.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn scale(smoke: bool, full: bool) -> Scale {
    if smoke {
        Scale::Smoke
    } else if full {
        Scale::Full
    } else {
        Scale::Quick
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd.unwrap_or(Cmd::Report(ReportArgs::default())) {
        Cmd::Report(a) => {
            let out = a.out.unwrap_or_else(report::default_out_dir);
            for o in &a.only {
                if suites::find(o).is_none() {
                    eprintln!("kmem: no suite named {o:?} (kmem bench --list)");
                    return ExitCode::from(2);
                }
            }
            match report::run_report(scale(a.smoke, a.full), &out, &a.only) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kmem: writing the report to {}: {e}", out.display());
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Bench(b) => {
            if b.list || b.suite.is_none() {
                for s in suites::all() {
                    println!("{:<12} {}", s.name(), s.title());
                }
                return if b.list {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(2)
                };
            }
            let name = b.suite.unwrap();
            let Some(suite) = suites::find(&name) else {
                eprintln!("kmem: no suite named {name:?}; the suites are:");
                for s in suites::all() {
                    eprintln!("  {:<12} {}", s.name(), s.title());
                }
                return ExitCode::from(2);
            };
            let sc = scale(b.smoke, b.full);
            let ran = report::run_suite(suite, sc, b.threads, b.cpus);
            if b.json {
                println!("{}", report::suite_json(&ran, sc, &MachineJson::current()));
            } else {
                print!("{}", report::suite_text(&ran));
            }
            ExitCode::SUCCESS
        }
    }
}
