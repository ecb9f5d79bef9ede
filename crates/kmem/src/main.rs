//! `kmem`: runs kmem's benchmark suites beside the seeds' published figures.
//!
//! ```text
//!   kmem                          same as `kmem report`
//!   kmem report [--smoke|--full] [--out DIR] [--only a,b]
//!   kmem bench SUITE [--full|--smoke] [--json] [--threads N] [--cpus N] [--case a,b]
//!   kmem bench --list
//!   kmem kernel [--timeout SECS] [--quiet] [--json]
//! ```
//!
//! `kmem bench` is strict: it exits 1 when the suite measured nothing or left
//! something out (a peer not installed, a tool missing, a failed run), after
//! printing what it did measure, and 2 when asked for an option the suite
//! would ignore. `kmem report` lists such skips at the top and exits 0.
//! `kmem kernel` exits 0 only when the kernel booted under QEMU and every
//! in-kernel test passed; otherwise 1, with the reason on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use kmem::output::{MachineJson, Scale};
use kmem::suites::Suite;
use kmem::{kernel, report, setup, suites};

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
    /// Install the optional system packages the suites and tests use (peer
    /// allocators, wrk, g++...) with apt-get; `--check` only lists what is missing.
    Setup {
        /// List what is missing and the line that installs it; install nothing.
        #[arg(long)]
        check: bool,
    },
    /// Build kmem-kernel, boot it under QEMU with several CPUs and stream its
    /// serial log; exit 0 only when every in-kernel test passed.
    Kernel {
        /// Seconds to wait for the kernel's verdict before stopping QEMU.
        #[arg(long, default_value_t = kernel::DEFAULT_TIMEOUT_S)]
        timeout: u64,
        /// Print the kernel's JSON object as the last line of stdout.
        #[arg(long)]
        json: bool,
        /// Do not stream the serial log: print only the verdict.
        #[arg(long)]
        quiet: bool,
        /// The kernel's command line (`kmem.panic`: panic once up, to see
        /// the failure path).
        #[arg(long, default_value = "")]
        append: String,
    },
}

#[derive(Args, Default)]
struct ReportArgs {
    /// Tiny scale for CI: every case, seconds in all.
    #[arg(long, conflicts_with = "full")]
    smoke: bool,
    /// The seeds' own scale (slow).
    #[arg(long)]
    full: bool,
    /// Output directory (default: target/kmem-report of the workspace;
    /// target/kmem-report-smoke with --smoke, target/kmem-report-full with --full).
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
    /// Threads, for suites that take a thread count (at least 1; refused by the others).
    #[arg(long, value_parser = at_least_one)]
    threads: Option<usize>,
    /// CPUs, for suites that take a CPU count (at least 1; refused by the others).
    #[arg(long, value_parser = at_least_one)]
    cpus: Option<usize>,
    /// Only these cases, for suites that name theirs (malloc): names as in the
    /// JSON's `case`, comma-separated or repeated; `*` at one end matches a
    /// prefix or suffix, at both a part (`--case 'larson*,*@16t,*bench*'`). An
    /// unknown name is refused with the list.
    #[arg(long = "case", value_delimiter = ',')]
    cases: Vec<String>,
}

/// A count of threads or CPUs: 0 is refused with a message, not clamped.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Refuses `--case` for a suite that runs whole, and a pattern that names
/// none of the suite's cases, saying which exist.
fn check_cases(suite: &dyn Suite, sc: Scale, patterns: &[String]) -> Result<(), String> {
    if patterns.is_empty() {
        return Ok(());
    }
    let cases = suite.cases(sc);
    if cases.is_empty() {
        let which: Vec<&str> = suites::all()
            .iter()
            .filter(|s| !s.cases(sc).is_empty())
            .map(|s| s.name())
            .collect();
        return Err(format!(
            "suite {} runs whole and does not take --case (the suites that do: {})",
            suite.name(),
            which.join(", ")
        ));
    }
    for p in patterns {
        if !cases.iter().any(|c| suites::case_matches(p, c)) {
            return Err(format!(
                "suite {} has no case {p:?} at this scale on this machine; its cases: {}",
                suite.name(),
                cases.join(", ")
            ));
        }
    }
    Ok(())
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
            let sc = scale(a.smoke, a.full);
            let out = a.out.unwrap_or_else(|| report::default_out_dir(sc));
            for o in &a.only {
                if !report::report_suites().iter().any(|s| s.name() == o) {
                    eprintln!("kmem: no suite named {o:?} (kmem bench --list)");
                    return ExitCode::from(2);
                }
            }
            // The peers the report compares with: installed when that needs
            // no one's answer, else named with the line to run (and skipped).
            if let setup::Outcome::Missing(why) = setup::ensure() {
                eprintln!("kmem: {why}");
            }
            match report::run_report(sc, &out, &a.only) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kmem: writing the report to {}: {e}", out.display());
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Kernel {
            timeout,
            json,
            quiet,
            append,
        } => kernel::command(timeout, quiet, json, &append),
        Cmd::Setup { check } => {
            let need = setup::missing();
            if check {
                for p in &need {
                    println!("missing: {} ({})", p.name, p.why);
                }
                if need.is_empty() {
                    println!("all present");
                    return ExitCode::SUCCESS;
                }
                println!("run: {}", setup::install_line(&need));
                return ExitCode::FAILURE;
            }
            match setup::ensure() {
                setup::Outcome::AllPresent => println!("kmem setup: all present"),
                setup::Outcome::Installed(p) => println!("kmem setup: installed {}", p.join(" ")),
                setup::Outcome::Missing(why) => {
                    eprintln!("kmem setup: {why}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
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
            for (given, flag, takes) in [
                (
                    b.threads.is_some(),
                    "--threads",
                    Suite::takes_threads as fn(&_) -> _,
                ),
                (b.cpus.is_some(), "--cpus", Suite::takes_cpus),
            ] {
                if given && !takes(suite) {
                    let which: Vec<&str> = suites::all()
                        .iter()
                        .filter(|s| takes(**s))
                        .map(|s| s.name())
                        .collect();
                    eprintln!(
                        "kmem: suite {name} does not use {flag} (the suites that do: {})",
                        which.join(", ")
                    );
                    return ExitCode::from(2);
                }
            }
            let sc = scale(b.smoke, b.full);
            if let Err(why) = check_cases(suite, sc, &b.cases) {
                eprintln!("kmem: {why}");
                return ExitCode::from(2);
            }
            let ran = report::run_suite(suite, sc, b.threads, b.cpus, &b.cases);
            if b.json {
                println!("{}", report::suite_json(&ran, sc, &MachineJson::current()));
            } else {
                print!("{}", report::suite_text(&ran));
            }
            let missed = report::not_measured(&ran);
            if missed.is_empty() {
                return ExitCode::SUCCESS;
            }
            for k in &missed {
                eprintln!("kmem: bench {name}: {} not measured: {}", k.what, k.why);
            }
            if ran.output.results.is_empty() {
                eprintln!("kmem: bench {name} measured nothing");
            }
            ExitCode::FAILURE
        }
    }
}
