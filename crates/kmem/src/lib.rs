//! The `kmem` command's library: the benchmark harness, the suites, the seeds'
//! "before" designs as baselines, and the report.
//!
//! ```text
//!   harness     interleaved rounds, medians, a deterministic PRNG
//!   output      Measure / Published / Table / Figure, the suite JSON
//!   suites      the Suite trait and the registry (suites::all)
//!   baselines   the designs the seeds replaced, kept faithful for comparison
//!   preload     running whole programs under other allocators (LD_PRELOAD)
//!   kernel      kmem kernel: builds kmem-kernel, boots it under QEMU, reads its verdict
//!   report      runs suites, prints tables, writes target/kmem-report[-smoke|-full]/
//!   setup       the optional system packages, installed when possible
//!   svg         hand-written SVG charts and PNG maps
//! ```
//!
//! A suite measures kmem, the seed's baseline and the peers in one run,
//! interleaved, and reports ratios: on a shared 2-core machine an absolute time
//! means little, a ratio measured side by side means a lot.

#![warn(missing_docs)]

pub mod baselines;
pub mod harness;
pub mod kernel;
pub mod output;
pub mod preload;
pub mod progress;
pub mod report;
pub mod setup;
pub mod suites;
pub mod svg;
