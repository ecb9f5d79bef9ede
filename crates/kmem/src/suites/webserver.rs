//! Suite `webserver`: seed 003's web-server claim, reproduced.
//!
//! The epoll server of `crates/kmem-malloc/workloads/webserver.c` (one thread
//! per core, requests parsed into owned buffers, a response built per request)
//! runs under each allocator through `LD_PRELOAD` and is loaded from `wrk` on
//! loopback for a bounded time. Allocators are interleaved over several
//! rounds; the median requests per second is reported with the ratio to glibc
//! and to the power-of-two baseline.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use super::{Ctx, Suite};
use crate::harness::median;
use crate::output::{fmt_num, fmt_ratio, SuiteOutput, Table};
use crate::preload::{compile_workload, find_kmem_malloc, installed_peers, Preload};

/// See the module documentation.
pub struct WebserverSuite;

/// Parses `Requests/sec:   12345.67` from wrk's output.
fn requests_per_s(out: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18080)
}

/// Starts the server under `alloc`, loads it with wrk for `secs`, returns req/s.
fn one_run(
    server: &std::path::Path,
    alloc: &Preload,
    threads: usize,
    secs: u64,
    conns: usize,
) -> Result<f64, String> {
    let port = free_port();
    let mut cmd = alloc.command(server);
    cmd.args([port.to_string(), threads.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the server: {e}"))?;
    let mut ready = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut ready);
    let result = if ready.trim() != "ready" {
        Err("the server did not start".to_string())
    } else {
        Command::new("wrk")
            .args([
                "-t1",
                &format!("-c{conns}"),
                &format!("-d{secs}s"),
                "--latency",
            ])
            .arg(format!("http://127.0.0.1:{port}/index.html"))
            .output()
            .map_err(|e| format!("running wrk: {e} (apt-get install wrk)"))
            .and_then(|o| {
                requests_per_s(&String::from_utf8_lossy(&o.stdout))
                    .ok_or_else(|| "no Requests/sec in wrk output".into())
            })
    };
    let _ = child.kill();
    let status = child.wait();
    // A server that died on its own (not by our kill) is a failure.
    if let Ok(s) = status {
        use std::os::unix::process::ExitStatusExt;
        if s.signal() != Some(9) {
            return Err(format!("the server exited by itself: {s}"));
        }
    }
    result
}

impl Suite for WebserverSuite {
    fn name(&self) -> &'static str {
        "webserver"
    }

    fn title(&self) -> &'static str {
        "seed 003's claim: an epoll web server under glibc, kmem, the power-of-two baseline and peers, loaded by wrk"
    }

    fn seed(&self) -> Option<&'static str> {
        Some("003")
    }

    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput {
        let mut out = SuiteOutput::default();
        out.publish(
            "webserver",
            "slab (before)",
            "requests_per_s",
            1600.0,
            "req/s",
            "seed 003: 1600-1800 requests/s (low end)",
        );
        out.publish(
            "webserver",
            "slab (before)",
            "requests_per_s",
            1800.0,
            "req/s",
            "seed 003: 1600-1800 requests/s (high end)",
        );
        out.publish(
            "webserver",
            "nta (after)",
            "requests_per_s",
            2450.0,
            "req/s",
            "seed 003: more than 2450 requests/s",
        );
        out.publish(
            "webserver",
            "nta (after)",
            "ratio_to_before",
            1.4,
            "x",
            "seed 003: more than 40 % better",
        );
        if Command::new("wrk").arg("--version").output().is_err() {
            out.skip(
                "the webserver suite",
                "wrk is not installed (apt-get install wrk), or not on PATH",
            );
            return out;
        }
        // Without kmem's library there is nothing to compare: measure nothing.
        let lib = match find_kmem_malloc() {
            Ok(lib) => lib,
            Err(e) => {
                out.skip("the webserver suite", e);
                return out;
            }
        };
        let server = match compile_workload("webserver") {
            Ok(p) => p,
            Err(e) => {
                out.skip(
                    "the webserver suite",
                    format!("the server could not be built: {e}"),
                );
                return out;
            }
        };
        let mut allocs = vec![Preload {
            name: "glibc".into(),
            lib: None,
            env: Vec::new(),
        }];
        out.notes
            .push(format!("kmem is {} through LD_PRELOAD", lib.display()));
        allocs.push(Preload {
            name: "kmem".into(),
            lib: Some(lib.clone()),
            env: Vec::new(),
        });
        allocs.push(Preload {
            name: "pow2 baseline".into(),
            lib: Some(lib),
            env: vec![("KMEM_OPTIONS".into(), "engine=pow2".into())],
        });
        let (peers, missing) = installed_peers();
        allocs.extend(peers);
        for m in missing {
            out.skip(m.what, m.why);
        }

        let threads = ctx.threads.unwrap_or_else(kmem_sys::cpu::online_cpus);
        let secs = ctx.scale.pick(1, 3, 10);
        let rounds = ctx.scale.pick(1, 3, 5);
        let conns = 64;
        ctx.progress.set_steps(rounds * allocs.len());
        let mut rps: Vec<Vec<f64>> = vec![Vec::new(); allocs.len()];
        let mut failed: Vec<Option<String>> = vec![None; allocs.len()];
        for r in 0..rounds {
            for k in 0..allocs.len() {
                let i = (r + k) % allocs.len();
                ctx.progress.step(&allocs[i].name);
                if failed[i].is_some() {
                    continue;
                }
                match one_run(&server, &allocs[i], threads, secs, conns) {
                    Ok(v) => rps[i].push(v),
                    Err(e) => failed[i] = Some(e),
                }
            }
        }
        let med: Vec<f64> = rps.iter().map(|v| median(v)).collect();
        let base = allocs.iter().position(|a| a.name == "pow2 baseline");
        let mut t = Table::new(
            format!("Requests per second, {threads} server thread(s), wrk 1 thread / {conns} connections, {secs} s x {rounds} rounds (median)"),
            &["allocator", "req/s", "vs glibc", "vs pow2 baseline", "seed"],
        );
        for (i, a) in allocs.iter().enumerate() {
            if let Some(f) = &failed[i] {
                out.skip(a.name.as_str(), format!("FAILED ({f})"));
                out.measure("webserver", a.name.as_str(), "failed", 1.0, "bool");
                continue;
            }
            let vg = med[i] / med[0];
            let vb = base.map_or(f64::NAN, |b| med[i] / med[b]);
            out.measure(
                "webserver",
                a.name.as_str(),
                "requests_per_s",
                med[i],
                "req/s",
            );
            out.measure("webserver", a.name.as_str(), "ratio_to_glibc", vg, "x");
            if vb.is_finite() {
                out.measure(
                    "webserver",
                    a.name.as_str(),
                    "ratio_to_pow2_baseline",
                    vb,
                    "x",
                );
            }
            let seed = match a.name.as_str() {
                "kmem" => "2450+ req/s (1.4x+ the slab)",
                "pow2 baseline" => "1600-1800 req/s",
                _ => "",
            };
            t.row(vec![
                a.name.clone(),
                fmt_num(med[i]),
                fmt_ratio(vg),
                fmt_ratio(vb),
                seed.into(),
            ]);
        }
        out.tables.push(t);
        out.notes.push(
            "server and wrk share this machine's cores; the seed's server ran alone on a 2006 machine, so compare ratios, not absolute rates"
                .into(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_wrk() {
        let s = "Running 1s test\n  1 threads and 8 connections\nRequests/sec:  12345.67\nTransfer/sec: 1MB\n";
        assert_eq!(requests_per_s(s), Some(12345.67));
        assert_eq!(requests_per_s("nothing"), None);
    }
}
