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
    /// `--case`: the cases to run, for suites that name theirs
    /// ([`Suite::cases`]); empty runs every case.
    pub only: &'a [String],
}

impl Ctx<'_> {
    /// Whether `case` is to run: every case when `--case` was not given,
    /// else the cases a pattern matches ([`case_matches`]).
    pub fn wants(&self, case: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| case_matches(p, case))
    }
}

/// Whether `--case` pattern `pattern` names `case`: the same name, or with a
/// `*` at its end or start, a prefix or suffix of it (`larson*` is larson at
/// every thread count, `*@16t` every run at 16 threads), with one at both
/// ends, a part of it (`*bench*`).
pub fn case_matches(pattern: &str, case: &str) -> bool {
    if let Some(part) = pattern.strip_prefix('*').and_then(|p| p.strip_suffix('*')) {
        case.contains(part)
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        case.starts_with(prefix)
    } else if let Some(suffix) = pattern.strip_prefix('*') {
        case.ends_with(suffix)
    } else {
        pattern == case
    }
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
    /// The cases `--case` can pick at `scale` on this machine, in the order
    /// they run; empty for a suite that runs whole (`kmem bench` refuses
    /// `--case` for it).
    fn cases(&self, _scale: Scale) -> Vec<String> {
        Vec::new()
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

    #[test]
    fn case_patterns_match_names_prefixes_and_suffixes() {
        assert!(case_matches("larson", "larson"));
        assert!(!case_matches("larson", "larson@16t"));
        assert!(case_matches("larson*", "larson@16t"));
        assert!(case_matches("*@16t", "mstress@16t"));
        assert!(!case_matches("*@16t", "mstress"));
        assert!(case_matches("*bench*", "sh8bench@16t"));
        assert!(case_matches("*", "larson"));
        let p = Progress::hidden();
        let only = ["glibc_thread*".to_string(), "churn_small".to_string()];
        let ctx = Ctx {
            scale: Scale::Smoke,
            threads: None,
            cpus: None,
            progress: &p,
            only: &only,
        };
        assert!(ctx.wants("glibc_thread@1t") && ctx.wants("churn_small"));
        assert!(!ctx.wants("larson"));
        let every = Ctx { only: &[], ..ctx };
        assert!(every.wants("larson"));
    }

    #[test]
    fn only_the_malloc_suite_names_its_cases() {
        for s in all() {
            let cases = s.cases(Scale::Quick);
            assert_eq!(cases.is_empty(), s.name() != "malloc", "{}", s.name());
        }
        let cases = find("malloc").unwrap().cases(Scale::Quick);
        for c in ["larson", "larson@1t", "glibc_simple", "churn_mixed"] {
            assert!(cases.iter().any(|x| x == c), "{c} missing from {cases:?}");
        }
    }
}
