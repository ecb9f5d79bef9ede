//! `kmem kernel`: builds kmem-kernel, boots it under QEMU with several CPUs
//! and reads its verdict from the serial port; also the report's `kernel`
//! section ([`KernelSuite`]).
//!
//! ```text
//!   cargo rustc -p kmem-kernel --release --crate-type staticlib -- --cfg kmem_kernel
//!                                     -> target/kernel/release/libkmem_kernel.a
//!   ld -T link.ld (LINK_SCRIPT)       -> target/kernel/kmem-kernel.elf
//!   objcopy -O binary                 -> target/kernel/kmem-kernel.bin
//!   qemu-system-x86_64 -kernel kmem-kernel.bin -smp CPUS -m MEMORY_MIB -no-reboot
//!       COM1 -> stdout, read line by line     isa-debug-exit at EXIT_PORT -> status
//! ```
//!
//! A pass is all three of: QEMU's status `qemu_status(EXIT_PASS)` (33), a
//! `JSON_PREFIX` line whose JSON parses with no test `"ok": false`, and a
//! last `N passed, 0 failed` line with N > 0. Anything else is a failure with
//! one reason: no verdict within the time limit (a hang, or a fault loop:
//! QEMU is killed), status 0 (the CPU reset: a triple fault, as QEMU runs with
//! `-no-reboot`), `qemu_status(EXIT_FAIL)` (the failed tests, or the
//! `kernel panic:` line), QEMU's own failure (status 1, its message), or a
//! status 33 without the JSON or the summary.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kmem_kernel::protocol::{
    qemu_status, CPUS, EXIT_FAIL, EXIT_PASS, EXIT_PORT, JSON_PREFIX, LINK_SCRIPT, MEMORY_MIB,
};
use serde_json::Value;

use crate::output::{fmt_num, fmt_ratio, Skip, SuiteOutput, Table};
use crate::setup::program;
use crate::suites::{Ctx, Suite};

/// The emulator that boots the kernel (Debian package `qemu-system-x86`).
pub const QEMU: &str = "qemu-system-x86_64";

/// The time limit of a boot, in seconds, when `--timeout` is not given (and
/// in the report).
pub const DEFAULT_TIMEOUT_S: u64 = 60;

/// The workspace this binary was built from: the kernel is built from its
/// sources.
pub fn workspace_root() -> PathBuf {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ws.canonicalize().unwrap_or(ws)
}

/// What keeps the kernel from being built and booted here, if anything: QEMU,
/// `ld` or `objcopy` not on `PATH`, or no kmem workspace at `root`.
pub fn missing(root: &Path) -> Option<Skip> {
    let skip = |what: &str, why: String| {
        Some(Skip {
            what: what.into(),
            why,
        })
    };
    if !cfg!(target_arch = "x86_64") {
        return skip(
            "an x86-64 host",
            "the kernel is built with the host's toolchain for x86-64 (no bare-metal target \
             is installed); this host is not x86-64"
                .into(),
        );
    }
    if !program(QEMU) {
        return skip(
            QEMU,
            "not found: run `kmem setup` (installs qemu-system-x86)".into(),
        );
    }
    for tool in ["ld", "objcopy"] {
        if !program(tool) {
            return skip(
                tool,
                "not found: install binutils (part of build-essential): \
                 sudo apt-get install -y binutils"
                    .into(),
            );
        }
    }
    if !root.join("crates/kmem-kernel/Cargo.toml").is_file() {
        return skip(
            "the kmem workspace",
            format!(
                "not found at {} (this binary was built there and has moved?): the kernel is \
                 built from its sources; run `cargo run --release -- kernel` in a checkout",
                root.display()
            ),
        );
    }
    None
}

/// Runs `cmd` to completion; on failure, says `what` failed with the first
/// error line of its output, then (from the second line on) all of it.
fn run_step(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out: Output = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err
        .lines()
        .find(|l| l.starts_with("error"))
        .or_else(|| err.lines().find(|l| !l.trim().is_empty()))
        .unwrap_or("no message");
    Err(format!("{what} failed ({}): {first}\n{err}", out.status))
}

/// Builds the kernel of the workspace at `root` in `root/target/kernel`
/// (release, with `$CARGO` or `cargo`), links it with [`LINK_SCRIPT`] and
/// returns the flat binary QEMU boots. Cargo's output is shown only on
/// failure: the error's first line says what failed, the rest is the output.
pub fn build_kernel(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("target/kernel");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_step(
        Command::new(cargo)
            .current_dir(root)
            .args(["rustc", "-p", "kmem-kernel", "--release"])
            .args(["--crate-type", "staticlib", "--target-dir"])
            .arg(&dir)
            .args(["--", "--cfg", "kmem_kernel"])
            // Flags meant for host programs (coverage, target-cpu=native)
            // have no place in the kernel.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
        "building kmem-kernel (cargo rustc)",
    )?;
    std::fs::write(dir.join("link.ld"), LINK_SCRIPT)
        .map_err(|e| format!("writing {}: {e}", dir.join("link.ld").display()))?;
    run_step(
        Command::new("ld").current_dir(&dir).args([
            "-n",
            "-static",
            "-nostdlib",
            "--gc-sections",
            "--no-warn-rwx-segments",
            "-T",
            "link.ld",
            "-u",
            "_start",
            "-u",
            "kmain",
            "-u",
            "ap_main",
            "-o",
            "kmem-kernel.elf",
            "release/libkmem_kernel.a",
        ]),
        "linking kmem-kernel (ld)",
    )?;
    run_step(
        Command::new("objcopy").current_dir(&dir).args([
            "-O",
            "binary",
            "kmem-kernel.elf",
            "kmem-kernel.bin",
        ]),
        "making the flat image (objcopy)",
    )?;
    Ok(dir.join("kmem-kernel.bin"))
}

/// What one boot produced.
#[derive(Debug)]
pub struct Outcome {
    /// The serial log, one entry a line, without carriage returns or
    /// terminal escape sequences.
    pub lines: Vec<String>,
    /// QEMU's exit status; None when it was killed.
    pub status: Option<i32>,
    /// Whether QEMU was killed because the time limit expired.
    pub timed_out: bool,
    /// The time limit.
    pub timeout: Duration,
    /// What QEMU itself wrote to stderr.
    pub stderr: String,
    /// The object on the [`JSON_PREFIX`] line, or why there is none.
    pub json: Result<Value, String>,
    /// Seconds from starting QEMU to its exit.
    pub seconds: f64,
}

/// A serial line as text: the firmware's escape sequences, carriage returns
/// and the newline removed.
fn clean(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            // ESC [ parameters final-byte (CSI), or ESC and one character.
            '\x1b' => {
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' | '\n' => {}
            c => out.push(c),
        }
    }
    out
}

/// A JSON string as it is, anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

/// `(passed, failed)` of a `N passed, M failed` line.
fn summary_of(line: &str) -> Option<(usize, usize)> {
    let (p, f) = line.trim().split_once(" passed, ")?;
    Some((p.parse().ok()?, f.strip_suffix(" failed")?.parse().ok()?))
}

/// The JSON object on the [`JSON_PREFIX`] line of `lines`.
fn json_of(lines: &[String]) -> Result<Value, String> {
    let text = lines
        .iter()
        .find_map(|l| l.split_once(JSON_PREFIX).map(|(_, j)| j))
        .ok_or_else(|| format!("no {:?} line", JSON_PREFIX.trim()))?;
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("the JSON line is not an object".into()),
        Err(e) => Err(format!("the JSON line does not parse: {e}")),
    }
}

/// Boots the flat image `bin` under QEMU with [`CPUS`] CPUs and
/// [`MEMORY_MIB`] MiB, printing each serial line as it arrives when
/// `stream`; kills QEMU when `timeout` expires first. Errs only when QEMU
/// cannot be started.
pub fn boot(bin: &Path, timeout: Duration, stream: bool) -> Result<Outcome, String> {
    boot_with(bin, timeout, stream, "")
}

/// [`boot`] with a kernel command line (QEMU's `-append`, multiboot's
/// cmdline): `protocol::PANIC_WORD` makes the kernel panic once it is up.
pub fn boot_with(
    bin: &Path,
    timeout: Duration,
    stream: bool,
    append: &str,
) -> Result<Outcome, String> {
    let t0 = Instant::now();
    let mut child = Command::new(QEMU)
        .arg("-kernel")
        .arg(bin)
        .args(["-append", append])
        .args(["-smp", &CPUS.to_string(), "-m", &format!("{MEMORY_MIB}M")])
        // COM1 on stdout and no screen: unlike -nographic, SeaBIOS then
        // writes nothing to the serial port; no network card, so no iPXE.
        .args(["-display", "none", "-serial", "stdio", "-nic", "none"])
        // A triple fault stops QEMU with status 0 instead of rebooting.
        .arg("-no-reboot")
        .arg("-device")
        .arg(format!("isa-debug-exit,iobase={EXIT_PORT:#x},iosize=0x04"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("{QEMU} not found: run `kmem setup` (installs qemu-system-x86)")
            }
            _ => format!("starting {QEMU}: {e}"),
        })?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            if tx.send(clean(&buf)).is_err() {
                break;
            }
            buf.clear();
        }
    });
    let mut err_pipe = child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = t0 + timeout;
    let mut lines = Vec::new();
    let mut take = |l: String| {
        if stream {
            println!("{l}");
        }
        lines.push(l);
    };
    // Lines until QEMU closes its stdout (it exits) or the time is up.
    while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        take(l);
    }
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
        }
    };
    let seconds = t0.elapsed().as_secs_f64();
    let _ = reader.join();
    // What was written just before the end.
    rx.try_iter().for_each(&mut take);
    let json = json_of(&lines);
    let status = status.and_then(|s| s.code());
    Ok(Outcome {
        timed_out: timed_out && status.is_none(),
        status,
        timeout,
        stderr: err_reader.join().unwrap_or_default(),
        json,
        seconds,
        lines,
    })
}

impl Outcome {
    /// `(passed, failed)` of the last `N passed, M failed` line.
    pub fn summary(&self) -> Option<(usize, usize)> {
        self.lines.iter().rev().find_map(|l| summary_of(l))
    }

    /// The CPUs the kernel reports (`"cpus"` of the JSON).
    pub fn cpus(&self) -> Option<u64> {
        self.json.as_ref().ok()?["cpus"].as_u64()
    }

    /// `name: detail` of each test of the JSON that is not `"ok": true`.
    pub fn failed_tests(&self) -> Vec<String> {
        let Ok(j) = &self.json else { return Vec::new() };
        j["tests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["ok"].as_bool() != Some(true))
            .map(|t| format!("{}: {}", text(&t["name"]), text(&t["detail"])))
            .collect()
    }

    /// The last non-empty serial line, quoted, or `(none)`.
    fn last_line(&self) -> String {
        self.lines
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or_else(|| "(none)".into(), |l| format!("{l:?}"))
    }

    /// The `N passed, 0 failed` line when the kernel passed (see the module
    /// documentation), else the one-line reason it did not.
    pub fn verdict(&self) -> Result<String, String> {
        let (pass, fail) = (qemu_status(EXIT_PASS), qemu_status(EXIT_FAIL));
        let failed = self.failed_tests();
        match self.status {
            None if self.timed_out => Err(format!(
                "no verdict within {} s: the kernel hung (or looped in a fault); last serial line: {}",
                self.timeout.as_secs_f64(),
                self.last_line()
            )),
            None => Err(format!(
                "{QEMU} was killed by a signal; last serial line: {}",
                self.last_line()
            )),
            Some(0) => Err(format!(
                "the CPU reset (QEMU status 0 under -no-reboot): a triple fault; last serial line: {}",
                self.last_line()
            )),
            Some(s) if s == fail => {
                let why = if let Some(p) = self.lines.iter().find(|l| l.contains("kernel panic:")) {
                    p.trim().to_string()
                } else if !failed.is_empty() {
                    format!("{} test(s) failed: {}", failed.len(), failed.join("; "))
                } else {
                    format!("no failed test named; last serial line: {}", self.last_line())
                };
                Err(format!("the kernel failed (status {s}): {why}"))
            }
            Some(s) if s == pass => {
                let bad = |why: String| Err(format!("status {s} (pass), but {why}"));
                if let Err(e) = &self.json {
                    return bad(e.clone());
                }
                match self.summary() {
                    None => bad("no `N passed, M failed` line".into()),
                    Some((0, _)) => bad("no test ran (0 passed)".into()),
                    Some((_, f)) if f > 0 => bad(format!("{f} test(s) failed")),
                    Some(_) if !failed.is_empty() => bad(format!(
                        "the JSON has failed tests: {}",
                        failed.join("; ")
                    )),
                    Some((p, _)) => Ok(format!("{p} passed, 0 failed")),
                }
            }
            Some(s) => {
                let msg = self.stderr.lines().rfind(|l| !l.trim().is_empty());
                Err(format!(
                    "{QEMU} exited with status {s}: {}",
                    msg.unwrap_or("no message (not a kernel verdict)")
                ))
            }
        }
    }
}

/// `kmem kernel`: builds, boots with a `timeout_s` time limit, streams the
/// serial log unless `quiet`, prints the verdict (and the JSON last, with
/// `json`); exits 0 only when the kernel passed, else 1 with the reason on
/// stderr.
pub fn command(timeout_s: u64, quiet: bool, json: bool, append: &str) -> ExitCode {
    let fail = |why: &str| {
        eprintln!("kmem kernel: {why}");
        ExitCode::FAILURE
    };
    let root = workspace_root();
    if let Some(k) = missing(&root) {
        return fail(&format!("{} {}", k.what, k.why));
    }
    if !quiet {
        eprintln!(
            "kmem kernel: building kmem-kernel in {}",
            root.join("target/kernel").display()
        );
    }
    let bin = match build_kernel(&root) {
        Ok(b) => b,
        Err(e) => {
            let (why, detail) = e.split_once('\n').unwrap_or((&e, ""));
            eprint!("{detail}");
            return fail(why);
        }
    };
    if !quiet {
        eprintln!(
            "kmem kernel: booting {} under {QEMU} ({CPUS} CPUs, {MEMORY_MIB} MiB, time limit {timeout_s} s)",
            bin.display()
        );
    }
    let o = match boot_with(&bin, Duration::from_secs(timeout_s), !quiet, append) {
        Ok(o) => o,
        Err(e) => return fail(&e),
    };
    let verdict = o.verdict();
    match (&verdict, o.summary()) {
        (Ok(line), _) => println!(
            "kmem kernel: {line} ({} of {CPUS} CPUs up, {:.1} s)",
            o.cpus().map_or("?".into(), |c| c.to_string()),
            o.seconds
        ),
        (Err(_), Some((p, f))) => println!("kmem kernel: {p} passed, {f} failed"),
        (Err(_), None) => {}
    }
    if let (true, Ok(j)) = (json, &o.json) {
        println!("{j}");
    }
    match verdict {
        Ok(_) => ExitCode::SUCCESS,
        Err(why) => fail(&why),
    }
}

/// The report's `kernel` section: the kernel's tests and its cycles per
/// operation (kmem beside the baselines), from one boot at every scale.
/// What keeps it from running (QEMU missing, a failed build, a failed test)
/// is a skip, listed at the top of the report.
pub struct KernelSuite;

impl Suite for KernelSuite {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn title(&self) -> &'static str {
        "kmem-kernel under QEMU: the allocators' in-kernel tests on several CPUs, and cycles per operation beside the baselines"
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut o = SuiteOutput::default();
        let root = workspace_root();
        if let Some(k) = missing(&root) {
            o.skip(k.what, k.why);
            return o;
        }
        ctx.progress.set_steps(2);
        ctx.progress.step("build");
        let bin = match build_kernel(&root) {
            Ok(b) => b,
            Err(e) => {
                o.skip("kmem-kernel", e.lines().next().unwrap_or_default());
                return o;
            }
        };
        ctx.progress.step(&format!("boot ({CPUS} CPUs)"));
        let run = match boot(&bin, Duration::from_secs(DEFAULT_TIMEOUT_S), false) {
            Ok(r) => r,
            Err(e) => {
                o.skip("kmem-kernel", e);
                return o;
            }
        };
        if let Err(why) = run.verdict() {
            o.skip("kmem-kernel", why);
        }
        let Ok(j) = &run.json else { return o };
        let (p, f) = run.summary().unwrap_or_default();
        let mut tests = Table::new(
            format!(
                "In-kernel tests: {p} passed, {f} failed, {} CPUs up of {CPUS} ({:.1} s under QEMU)",
                run.cpus().map_or("?".into(), |c| c.to_string()),
                run.seconds
            ),
            &["test", "result"],
        );
        for t in j["tests"].as_array().into_iter().flatten() {
            let ok = t["ok"].as_bool() == Some(true);
            let result = if ok { "ok" } else { "FAILED" };
            tests.row(vec![
                text(&t["name"]),
                format!("{result}: {}", text(&t["detail"])),
            ]);
        }
        o.tables.push(tests);
        cycles(&mut o, j);
        o
    }
}

/// The JSON's `cycles` rows as measurements (metric named after the unit:
/// `cycles/op` is `cycles_per_op`) and one table: a column per
/// implementation, and kmem's speedup over the baseline where both exist.
fn cycles(o: &mut SuiteOutput, j: &Value) {
    let rows = j["cycles"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return;
    }
    let (mut cases, mut imps) = (Vec::<String>::new(), Vec::<String>::new());
    for r in &rows {
        let (Some(case), Some(imp), Some(v)) =
            (r["case"].as_str(), r["impl"].as_str(), r["value"].as_f64())
        else {
            continue;
        };
        let unit = r["unit"].as_str().unwrap_or("cycles/op");
        o.measure(
            case,
            imp,
            unit.replace('/', "_per_").replace(' ', "_"),
            v,
            unit,
        );
        for (list, x) in [(&mut cases, case), (&mut imps, imp)] {
            if !list.iter().any(|c| c == x) {
                list.push(x.to_string());
            }
        }
    }
    let both = ["kmem", "baseline"]
        .iter()
        .all(|i| imps.iter().any(|x| x == i));
    let mut cols: Vec<&str> = std::iter::once("case")
        .chain(imps.iter().map(String::as_str))
        .collect();
    if both {
        cols.push("speedup");
    }
    let mut t = Table::new(
        "Cycles per operation inside the kernel (lower is better; speedup = baseline / kmem)",
        &cols,
    );
    for c in &cases {
        let get = |i: &str| {
            o.results
                .iter()
                .find(|m| &m.case == c && m.imp == i)
                .map(|m| m.value)
        };
        let mut row = vec![c.clone()];
        row.extend(imps.iter().map(|i| get(i).map_or("-".into(), fmt_num)));
        if both {
            row.push(match (get("baseline"), get("kmem")) {
                (Some(b), Some(k)) if k > 0.0 => fmt_ratio(b / k),
                _ => "-".into(),
            });
        }
        t.row(row);
    }
    o.tables.push(t);
    o.notes.push(
        "Cycles are counted inside the guest, under QEMU's emulation: the ratio of kmem to \
         its baseline, measured in the same boot, means more than either value."
            .into(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(status: Option<i32>, log: &[&str]) -> Outcome {
        let lines: Vec<String> = log.iter().map(|l| l.to_string()).collect();
        Outcome {
            json: json_of(&lines),
            lines,
            status,
            timed_out: status.is_none(),
            timeout: Duration::from_secs(7),
            stderr: String::new(),
            seconds: 0.1,
        }
    }

    const GOOD: &str = r#"KMEM-KERNEL-JSON {"cpus":4,"tests":[{"name":"a","ok":true,"detail":"x"},{"name":"b","ok":true,"detail":"y"}],"cycles":[{"case":"c","impl":"kmem","value":10.0,"unit":"cycles/op"},{"case":"c","impl":"baseline","value":25.0,"unit":"cycles/op"}]}"#;
    const BAD: &str = r#"KMEM-KERNEL-JSON {"cpus":4,"tests":[{"name":"a","ok":true,"detail":"x"},{"name":"b","ok":false,"detail":"leaked 3 pages"}],"cycles":[]}"#;

    #[test]
    fn escape_codes_and_carriage_returns_are_removed() {
        assert_eq!(
            clean(b"\x1bc\x1b[?7l\x1b[2J\x1b[0mSeaBIOS (version 1.16)\r\n"),
            "SeaBIOS (version 1.16)"
        );
        assert_eq!(clean(b"1 passed, 0 failed\r\n"), "1 passed, 0 failed");
        assert_eq!(summary_of("12 passed, 3 failed"), Some((12, 3)));
        assert_eq!(summary_of("passed, failed"), None);
    }

    #[test]
    fn each_outcome_has_its_verdict() {
        let ok = outcome(
            Some(33),
            &["kmem-kernel: booted", GOOD, "2 passed, 0 failed"],
        );
        assert_eq!(ok.verdict(), Ok("2 passed, 0 failed".into()));
        assert_eq!(ok.cpus(), Some(4));
        let v = |o: Outcome| o.verdict().unwrap_err();
        let hung = v(outcome(None, &["kmem-kernel: booted", "ap 1 up"]));
        assert!(
            hung.starts_with("no verdict within 7 s: the kernel hung"),
            "{hung}"
        );
        assert!(hung.ends_with("last serial line: \"ap 1 up\""), "{hung}");
        assert!(v(outcome(Some(0), &[])).contains("triple fault; last serial line: (none)"));
        let failed = v(outcome(Some(35), &[BAD, "1 passed, 1 failed"]));
        assert!(
            failed.ends_with("1 test(s) failed: b: leaked 3 pages"),
            "{failed}"
        );
        let panic = v(outcome(Some(35), &["kernel panic: at src/x.rs:3: oops"]));
        assert!(
            panic.ends_with("kernel panic: at src/x.rs:3: oops"),
            "{panic}"
        );
        // Status 33 is not enough.
        let no_json = v(outcome(Some(33), &["1 passed, 0 failed"]));
        assert!(
            no_json.contains("no \"KMEM-KERNEL-JSON\" line"),
            "{no_json}"
        );
        let broken = v(outcome(
            Some(33),
            &["KMEM-KERNEL-JSON {\"cpus\":", "1 passed, 0 failed"],
        ));
        assert!(broken.contains("does not parse"), "{broken}");
        assert!(v(outcome(Some(33), &[GOOD])).contains("no `N passed, M failed` line"));
        assert!(v(outcome(Some(33), &[GOOD, "0 passed, 0 failed"])).contains("0 passed"));
        assert!(v(outcome(Some(33), &[BAD, "2 passed, 0 failed"])).contains("b: leaked"));
        assert!(v(outcome(Some(1), &[])).contains("exited with status 1"));
    }

    #[test]
    fn the_report_tables_the_cycles_and_the_failures() {
        let mut o = SuiteOutput::default();
        cycles(&mut o, &json_of(&[GOOD.to_string()]).unwrap());
        assert_eq!(o.value("c", "baseline", "cycles_per_op"), Some(25.0));
        let t = &o.tables[0];
        assert_eq!(t.columns, ["case", "kmem", "baseline", "speedup"]);
        assert_eq!(t.rows[0], ["c", "10.0", "25.0", "2.50x"]);
    }

    /// A multiboot image loaded at 1 MiB whose 32-bit entry runs `code`.
    fn image(code: &[u8]) -> Vec<u8> {
        let (magic, flags) = (0x1BAD_B002u32, 0x0001_0000u32); // address fields
        let mut v = Vec::new();
        // magic, flags, checksum, header, load start, load end (0: the
        // file), bss end (0: none), entry (right after the header).
        for w in [
            magic,
            flags,
            magic.wrapping_add(flags).wrapping_neg(),
            0x10_0000,
            0x10_0000,
            0,
            0,
            0x10_0020,
        ] {
            v.extend(w.to_le_bytes());
        }
        v.extend(code);
        v
    }

    /// Code that writes `line` and a newline to COM1.
    fn say(line: &str) -> Vec<u8> {
        let mut c = vec![0x66, 0xBA, 0xF8, 0x03]; // mov dx, 0x3f8
        for b in line.bytes().chain([b'\n']) {
            c.extend([0xB0, b, 0xEE]); // mov al, b; out dx, al
        }
        c
    }

    /// Code that writes `v` to the debug-exit port, then halts.
    fn exit_with(v: u32) -> Vec<u8> {
        let mut c = vec![0x66, 0xBA, EXIT_PORT as u8, 0x00, 0xB8]; // mov dx, port; mov eax, v
        c.extend(v.to_le_bytes());
        c.extend([0xEF, 0xF4, 0xEB, 0xFD]); // out dx, eax; hlt; jmp hlt
        c
    }

    /// Hand-made kernels that hang, fault, fail and pass without a JSON
    /// line: the runner's verdict on each, through a real QEMU.
    #[test]
    fn failure_paths_under_qemu() {
        if !program(QEMU) {
            eprintln!(
                "failure_paths_under_qemu: skipped: {QEMU} not on PATH (kmem setup installs it)"
            );
            return;
        }
        // lidt [zero]; int3; jmp $; zero: an IDT of limit 0, so the
        // breakpoint faults, the fault double-faults, and the CPU resets.
        let zero = 0x10_0000u32 + 32 + 7 + 3;
        let mut lidt_int3 = vec![0x0F, 0x01, 0x1D];
        lidt_int3.extend(zero.to_le_bytes());
        lidt_int3.extend([0xCC, 0xEB, 0xFE, 0, 0, 0, 0, 0, 0]);
        let cases: [(&str, Vec<u8>, &str); 4] = [
            ("hang", [say("spinning"), vec![0xEB, 0xFE]].concat(), "no verdict within 1.5 s: the kernel hung (or looped in a fault); last serial line: \"spinning\""),
            ("reset", lidt_int3, "a triple fault"),
            ("panic", [say("kernel panic: by hand"), exit_with(EXIT_FAIL)].concat(), "the kernel failed (status 35): kernel panic: by hand"),
            ("nojson", [say("1 passed, 0 failed"), exit_with(EXIT_PASS)].concat(), "no \"KMEM-KERNEL-JSON\" line"),
        ];
        for (name, code, want) in cases {
            let bin =
                std::env::temp_dir().join(format!("kmem-kernel-{name}-{}.bin", std::process::id()));
            std::fs::write(&bin, image(&code)).unwrap();
            let o = boot(&bin, Duration::from_millis(1500), false).unwrap();
            let _ = std::fs::remove_file(&bin);
            let why = o.verdict().unwrap_err();
            assert!(why.contains(want), "{name}: {why:?}, {o:?}");
        }
    }
}
