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
    /// Runs at `ctx.scale` and returns what it measured.
    fn run(&self, ctx: &Ctx<'_>) -> SuiteOutput;
}

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
