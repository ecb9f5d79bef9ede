//! The benchmark suites, and the one place they are registered.
//!
//! A suite is a type implementing [`Suite`]; adding one means writing its
//! module and adding it to [`all`]. The report, `bench --list`, JSON and HTML
//! all work from that list and need no change.

use crate::output::{Scale, SuiteOutput};
use crate::progress::Progress;

mod churn;
mod core;
mod malloc;
mod nta;
mod pages;
mod percpu;
mod quicklist;
mod vmalloc;
mod webserver;
pub use self::core::CoreSuite;
pub use self::malloc::MallocSuite;
pub use self::nta::NtaSuite;
pub use self::pages::PagesSuite;
pub use self::percpu::PercpuSuite;
pub use self::quicklist::QuicklistSuite;
pub use self::vmalloc::VmallocSuite;
pub use self::webserver::WebserverSuite;

/// How a suite is asked to run.
pub struct Ctx<'a> {
    /// Smoke, quick or full.
    pub scale: Scale,
    /// `--threads N`, for suites with a thread count.
    pub threads: Option<usize>,
    /// `--cpus N`, for suites on a simulated topology.
    pub cpus: Option<usize>,
    /// Progress reporting.
    pub progress: &'a Progress,
}

/// A benchmark suite.
pub trait Suite: Sync {
    /// Short name for `kmem bench NAME`.
    fn name(&self) -> &'static str;
    /// One line saying what it measures.
    fn title(&self) -> &'static str;
    /// The seed file it reproduces, if any.
    fn seed(&self) -> Option<&'static str> {
        None
    }
    /// Whether the suite reads `ctx.threads` (`--threads N`); `kmem bench`
    /// refuses `--threads` for a suite that would ignore it.
    fn takes_threads(&self) -> bool {
        TAKE_THREADS.contains(&self.name())
    }
    /// Whether the suite reads `ctx.cpus` (`--cpus N`); `kmem bench` refuses
    /// `--cpus` for a suite that would ignore it.
    fn takes_cpus(&self) -> bool {
        TAKE_CPUS.contains(&self.name())
    }
    /// Runs at `ctx.scale` and returns what it measured.
    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput;
}

/// The suites that read `--threads`: a suite that starts reading it is added
/// here (or overrides [`Suite::takes_threads`]).
const TAKE_THREADS: &[&str] = &["vmalloc", "percpu", "pages", "webserver"];

/// The suites that read `--cpus`: a suite that starts reading it is added
/// here (or overrides [`Suite::takes_cpus`]).
const TAKE_CPUS: &[&str] = &["percpu", "pages", "quicklist"];

/// Every registered suite, in report order.
pub fn all() -> &'static [&'static dyn Suite] {
    &[
        &core::CoreSuite,
        &vmalloc::VmallocSuite,
        &percpu::PercpuSuite,
        &pages::PagesSuite,
        &quicklist::QuicklistSuite,
        &nta::NtaSuite,
        &malloc::MallocSuite,
        &webserver::WebserverSuite,
    ]
}

/// The suite of that name.
pub fn find(name: &str) -> Option<&'static dyn Suite> {
    all().iter().copied().find(|s| s.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_lists_name_registered_suites() {
        for name in TAKE_THREADS.iter().chain(TAKE_CPUS) {
            assert!(find(name).is_some(), "{name} is not a suite");
        }
        assert!(find("pages").unwrap().takes_threads());
        assert!(!find("malloc").unwrap().takes_threads());
        assert!(!find("webserver").unwrap().takes_cpus());
    }
}
