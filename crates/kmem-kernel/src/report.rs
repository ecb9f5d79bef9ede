//! What the tests and measurements found, and the report on serial: one
//! line per test as it ends, then one JSON line (`protocol::JSON_PREFIX`).

// A failure carries its message in a 128-byte `Text` (the kernel has no
// heap to box it in); one per test, on the stack.
#![allow(clippy::result_large_err)]

use core::fmt::{self, Write};
use core::sync::atomic::Ordering::Relaxed;

use kmem_core::Lock;

use crate::mm::{FRAMES, PAGE};
use crate::protocol::JSON_PREFIX;
use crate::vmalloc;

/// A fixed-capacity string (no heap needed to report).
#[derive(Clone, Copy)]
pub struct Text {
    buf: [u8; 120],
    len: usize,
}

impl Text {
    const fn new() -> Text {
        Text {
            buf: [0; 120],
            len: 0,
        }
    }
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
    }
}

impl Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if self.len < self.buf.len() && b.is_ascii() && b != b'"' && b != b'\\' {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        Ok(())
    }
}

pub fn text(args: fmt::Arguments<'_>) -> Text {
    let mut t = Text::new();
    let _ = t.write_fmt(args);
    t
}

#[derive(Clone, Copy)]
struct TestResult {
    name: &'static str,
    ok: bool,
    detail: Text,
}

#[derive(Clone, Copy)]
struct Cycles {
    case: &'static str,
    imp: &'static str,
    value: f64,
}

pub struct Results {
    tests: [Option<TestResult>; 32],
    cycles: [Option<Cycles>; 32],
}

impl Results {
    /// Tests run so far.
    pub fn tests(&self) -> usize {
        self.tests.iter().flatten().count()
    }
}

/// Everything recorded, for the report.
pub static RESULTS: Lock<Results> = Lock::new(Results {
    tests: [None; 32],
    cycles: [None; 32],
});

pub fn record_cycles(case: &'static str, imp: &'static str, value: f64) {
    kprintln!("  cycles: {case:<40} {imp:<9} {value:>10.1}");
    let mut r = RESULTS.lock();
    if let Some(slot) = r.cycles.iter_mut().find(|s| s.is_none()) {
        *slot = Some(Cycles { case, imp, value });
    }
}

pub type Outcome = Result<Text, Text>;

/// A test: its name and body.
pub type Test = (&'static str, fn() -> Outcome);

pub fn run(name: &'static str, f: fn() -> Outcome) -> bool {
    kprintln!("test {name} ...");
    let r = f();
    let ok = r.is_ok();
    let detail = match r {
        Ok(t) | Err(t) => t,
    };
    kprintln!(
        "test {name}: {} ({})",
        if ok { "ok" } else { "FAILED" },
        detail.as_str()
    );
    let mut res = RESULTS.lock();
    if let Some(slot) = res.tests.iter_mut().find(|s| s.is_none()) {
        *slot = Some(TestResult { name, ok, detail });
    }
    ok
}

pub fn report(ncpus: usize) {
    let r = RESULTS.lock();
    let f = FRAMES.get().stats();
    kprint!(
        "{JSON_PREFIX}{{\"cpus\":{ncpus},\"memory_bytes\":{},\"shootdowns\":{},\"tests\":[",
        f.total_pages * PAGE,
        vmalloc::SHOOTDOWNS.load(Relaxed)
    );
    for (i, t) in r.tests.iter().flatten().enumerate() {
        kprint!(
            "{}{{\"name\":\"{}\",\"ok\":{},\"detail\":\"{}\"}}",
            if i > 0 { "," } else { "" },
            t.name,
            t.ok,
            t.detail.as_str()
        );
    }
    kprint!("],\"cycles\":[");
    for (i, c) in r.cycles.iter().flatten().enumerate() {
        kprint!(
            "{}{{\"case\":\"{}\",\"impl\":\"{}\",\"value\":{:.1},\"unit\":\"cycles/op\"}}",
            if i > 0 { "," } else { "" },
            c.case,
            c.imp,
            c.value
        );
    }
    kprintln!("]}}");
}
