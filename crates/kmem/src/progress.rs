//! A suite's progress on stderr: a bar when stderr is a terminal, and
//! otherwise (CI, a log file) one line per finished case, so that a long
//! suite shows where it is without drawing a bar into a file.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// A suite's progress: a bar of steps with the current case as its message,
/// or one line per finished step.
pub struct Progress {
    how: How,
}

enum How {
    Bar(ProgressBar),
    Lines { suite: String, state: Mutex<Lines> },
}

struct Lines {
    out: Box<dyn Write + Send>,
    steps: usize,
    done: usize,
    current: Option<(String, Instant)>,
}

impl Progress {
    /// The progress of the named suite, with no steps known yet: a bar when
    /// stderr is a terminal, one line per finished case on stderr otherwise.
    pub fn new(suite: &str) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::lines(suite, Box::new(std::io::stderr()));
        }
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>10.bold} [{bar:30}] {pos}/{len} {elapsed:>4} {msg}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_prefix(suite.to_string());
        Progress { how: How::Bar(bar) }
    }

    /// A progress that writes one line to `out` as each step finishes:
    /// `suite: case done (i/n, 0.3 s)`.
    pub fn lines(suite: &str, out: Box<dyn Write + Send>) -> Progress {
        Progress {
            how: How::Lines {
                suite: suite.to_string(),
                state: Mutex::new(Lines {
                    out,
                    steps: 0,
                    done: 0,
                    current: None,
                }),
            },
        }
    }

    /// A progress that shows nothing (tests).
    pub fn hidden() -> Progress {
        Progress {
            how: How::Bar(ProgressBar::hidden()),
        }
    }

    /// Declares how many steps the suite will take.
    pub fn set_steps(&self, n: usize) {
        match &self.how {
            How::Bar(bar) => {
                bar.set_length(n.max(1) as u64);
                bar.set_position(0);
            }
            How::Lines { state, .. } => {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.steps = n;
                st.done = 0;
            }
        }
    }

    /// Marks the start of a step named `what` (and the end of the previous one).
    pub fn step(&self, what: &str) {
        match &self.how {
            How::Bar(bar) => {
                if bar.position() > 0 || !bar.message().is_empty() {
                    bar.inc(1);
                }
                bar.set_message(what.to_string());
            }
            How::Lines { suite, state } => {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.end_step(suite);
                st.current = Some((what.to_string(), Instant::now()));
            }
        }
    }

    /// Shows what the current step is doing now (a run inside a long case):
    /// the bar's message becomes `step: what`; the line mode, which writes
    /// one line per finished step, writes nothing for it.
    pub fn detail(&self, what: &str) {
        if let How::Bar(bar) = &self.how {
            let msg = bar.message();
            let step = msg.split(": ").next().unwrap_or("");
            bar.set_message(format!("{step}: {what}"));
        }
    }

    /// Ends the bar (or writes the last step's line); a second call does nothing.
    pub fn finish(&self) {
        match &self.how {
            How::Bar(bar) => {
                bar.set_position(bar.length().unwrap_or(1));
                bar.finish_and_clear();
            }
            How::Lines { suite, state } => {
                state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .end_step(suite);
            }
        }
    }
}

impl Lines {
    /// Writes the line of the step in progress, if any, and forgets it.
    fn end_step(&mut self, suite: &str) {
        let Some((what, t0)) = self.current.take() else {
            return;
        };
        self.done += 1;
        let of = if self.steps >= self.done {
            format!("{}/{}", self.done, self.steps)
        } else {
            self.done.to_string()
        };
        // Progress is best effort: a closed stderr must not stop a suite.
        let _ = writeln!(
            self.out,
            "{suite}: {what} done ({of}, {:.1} s)",
            t0.elapsed().as_secs_f64()
        );
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A shared buffer the test reads back.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_detail_shows_in_the_bar_message_after_the_step() {
        let p = Progress::hidden();
        p.set_steps(1);
        p.step("larson");
        p.detail("run 2/5, jemalloc");
        p.detail("run 3/5, kmem");
        let How::Bar(bar) = &p.how else {
            panic!("a hidden progress is a bar")
        };
        assert_eq!(bar.message(), "larson: run 3/5, kmem");
    }

    #[test]
    fn one_line_per_finished_case() {
        let buf = Buf::default();
        let p = Progress::lines("core", Box::new(buf.clone()));
        p.set_steps(2);
        p.step("search");
        p.step("current_cpu");
        p.finish();
        p.finish();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        // Details inside a step add no line.
        let p = Progress::lines("malloc", Box::new(buf.clone()));
        p.step("larson");
        p.detail("run 1/5, kmem");
        p.finish();
        let after = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(after.lines().count(), 3, "{after}");
        assert!(lines[0].starts_with("core: search done (1/2, "), "{text}");
        assert!(
            lines[1].starts_with("core: current_cpu done (2/2, "),
            "{text}"
        );
    }
}
