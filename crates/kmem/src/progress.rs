//! Progress bars on stderr (hidden when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

/// A suite's progress: a bar of steps with the current case as its message.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for the named suite, with no steps known yet.
    pub fn new(suite: &str) -> Progress {
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>10.bold} [{bar:30}] {pos}/{len} {elapsed:>4} {msg}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        bar.set_prefix(suite.to_string());
        Progress { bar }
    }

    /// A progress that shows nothing (tests).
    pub fn hidden() -> Progress {
        Progress {
            bar: ProgressBar::hidden(),
        }
    }

    /// Declares how many steps the suite will take.
    pub fn set_steps(&self, n: usize) {
        self.bar.set_length(n.max(1) as u64);
        self.bar.set_position(0);
    }

    /// Marks the start of a step named `what` (and the end of the previous one).
    pub fn step(&self, what: &str) {
        if self.bar.position() > 0 || !self.bar.message().is_empty() {
            self.bar.inc(1);
        }
        self.bar.set_message(what.to_string());
    }

    /// Ends the bar.
    pub fn finish(&self) {
        self.bar.set_position(self.bar.length().unwrap_or(1));
        self.bar.finish_and_clear();
    }
}
