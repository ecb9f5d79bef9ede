//! The shape of the machine an allocator serves, and where the current CPU comes from.
//!
//! A [`Topology`] is a number of CPUs, each in one package and one NUMA node.
//! It is plain data of fixed size (no heap), so kernels build one at boot; with
//! `std`, [`Topology::from_system`] reads this machine's. Allocators index their
//! per-CPU, per-package and per-node structures by the numbers it gives.
//!
//! [`Cpus`] says which CPU the calling thread is on:
//!
//! ```text
//!   Cpus::Real        the OS's answer (rseq cpu_id, else sched_getcpu), std only
//!   Cpus::Simulated   thread i acts as CPU i: bind_simulated_cpu(i), std only
//!   Cpus::Fixed(c)    always CPU c (one-CPU firmware, tests)
//!   Cpus::Custom(f)   a kernel's own smp_processor_id()
//! ```
//!
//! The simulated source is how the seeds' 16-CPU, 2-package experiments run on
//! a 2-core machine: correctness never depends on which CPU a thread claims
//! (every per-CPU structure is locked), only contention and locality do.

use crate::error::{Error, Result};

/// Most CPUs a [`Topology`] describes.
pub const MAX_CPUS: usize = 1024;

/// CPUs, packages and NUMA nodes, and the maps between them.
#[derive(Clone, PartialEq, Eq)]
pub struct Topology {
    cpus: u16,
    packages: u16,
    nodes: u16,
    package_of: [u16; MAX_CPUS],
    node_of: [u16; MAX_CPUS],
}

impl core::fmt::Debug for Topology {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Topology({} CPUs, {} packages, {} nodes)",
            self.cpus, self.packages, self.nodes
        )
    }
}

impl Topology {
    /// `cpus` CPUs in one package and one node.
    pub fn single(cpus: usize) -> Result<Topology> {
        Self::uniform(cpus, 1, 1)
    }

    /// `cpus` CPUs split into `packages` packages and `nodes` nodes of
    /// consecutive CPUs, as evenly as possible (CPU c is in package
    /// `c * packages / cpus`), e.g. 16 CPUs in 2 packages: 0-7 and 8-15.
    pub fn uniform(cpus: usize, packages: usize, nodes: usize) -> Result<Topology> {
        if cpus == 0 || cpus > MAX_CPUS {
            return Err(Error::BadConfig("CPU count must be 1..=1024"));
        }
        if packages == 0 || packages > cpus || nodes == 0 || nodes > cpus {
            return Err(Error::BadConfig("packages and nodes must be 1..=CPUs"));
        }
        Self::from_fn(cpus, |c| (c * packages / cpus, c * nodes / cpus))
    }

    /// A topology of `cpus` CPUs where `place(c)` gives CPU c's (package, node).
    /// Package and node numbers must be dense: every number below the largest used.
    pub fn from_fn(
        cpus: usize,
        mut place: impl FnMut(usize) -> (usize, usize),
    ) -> Result<Topology> {
        if cpus == 0 || cpus > MAX_CPUS {
            return Err(Error::BadConfig("CPU count must be 1..=1024"));
        }
        let mut t = Topology {
            cpus: cpus as u16,
            packages: 0,
            nodes: 0,
            package_of: [0; MAX_CPUS],
            node_of: [0; MAX_CPUS],
        };
        for c in 0..cpus {
            let (p, n) = place(c);
            if p >= cpus || n >= cpus {
                return Err(Error::BadConfig("package or node number out of range"));
            }
            t.package_of[c] = p as u16;
            t.node_of[c] = n as u16;
            t.packages = t.packages.max(p as u16 + 1);
            t.nodes = t.nodes.max(n as u16 + 1);
        }
        // Dense numbering: every package and node has a CPU.
        for p in 0..t.packages() {
            if t.cpus_in_package(p).next().is_none() {
                return Err(Error::BadConfig("package numbers must be dense"));
            }
        }
        for n in 0..t.nodes() {
            if t.cpus_in_node(n).next().is_none() {
                return Err(Error::BadConfig("node numbers must be dense"));
            }
        }
        Ok(t)
    }

    /// This machine's topology, from `/sys` (flat if it cannot be read; CPUs
    /// past [`MAX_CPUS`] are folded onto the first ones).
    #[cfg(feature = "std")]
    pub fn from_system() -> Topology {
        let sys = kmem_sys::read_topology();
        let n = sys.cpus.len().clamp(1, MAX_CPUS);
        Self::from_fn(n, |c| (sys.cpus[c].package, sys.cpus[c].node))
            .or_else(|_| Self::single(n))
            .expect("a single-package topology of 1..=MAX_CPUS CPUs is always valid")
    }

    /// Number of CPUs.
    #[inline]
    pub fn cpus(&self) -> usize {
        self.cpus as usize
    }

    /// Number of packages.
    #[inline]
    pub fn packages(&self) -> usize {
        self.packages as usize
    }

    /// Number of NUMA nodes.
    #[inline]
    pub fn nodes(&self) -> usize {
        self.nodes as usize
    }

    /// The package of `cpu` (CPUs past the end are folded back).
    #[inline]
    pub fn package_of(&self, cpu: usize) -> usize {
        self.package_of[self.fold(cpu)] as usize
    }

    /// The NUMA node of `cpu` (CPUs past the end are folded back).
    #[inline]
    pub fn node_of(&self, cpu: usize) -> usize {
        self.node_of[self.fold(cpu)] as usize
    }

    /// `cpu` if it is a CPU of this topology, else folded into range: a CPU
    /// number from the OS can exceed a smaller configured topology.
    #[inline(always)]
    pub fn fold(&self, cpu: usize) -> usize {
        if cpu < self.cpus as usize {
            cpu
        } else {
            cpu % self.cpus as usize
        }
    }

    /// The CPUs of package `p`.
    pub fn cpus_in_package(&self, p: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.cpus()).filter(move |&c| self.package_of[c] as usize == p)
    }

    /// The CPUs of node `n`.
    pub fn cpus_in_node(&self, n: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.cpus()).filter(move |&c| self.node_of[c] as usize == n)
    }

    /// How many CPUs node `n` has.
    pub fn cpus_on_node(&self, n: usize) -> usize {
        self.cpus_in_node(n).count()
    }

    /// How many CPUs package `p` has.
    pub fn cpus_on_package(&self, p: usize) -> usize {
        self.cpus_in_package(p).count()
    }
}

/// Where the current CPU number comes from.
pub trait CpuSource: Send + Sync {
    /// The CPU the calling thread is on now (a hint; it may move at once).
    fn current_cpu(&self) -> usize;
}

/// The CPU sources kmem provides; see the module documentation.
#[derive(Clone, Copy, Debug)]
pub enum Cpus {
    /// The operating system's answer (rseq, else `sched_getcpu`).
    #[cfg(feature = "os")]
    Real,
    /// The number bound to the calling thread with [`bind_simulated_cpu`]
    /// (threads that never bound one get 0, 1, 2... in order of first use).
    #[cfg(feature = "std")]
    Simulated,
    /// Always this CPU.
    Fixed(usize),
    /// A function that answers, such as a kernel's `smp_processor_id`.
    Custom(fn() -> usize),
}

impl Cpus {
    /// The calling thread's CPU.
    #[inline(always)]
    pub fn current(&self) -> usize {
        match *self {
            #[cfg(feature = "os")]
            Cpus::Real => kmem_sys::current_cpu(),
            #[cfg(feature = "std")]
            Cpus::Simulated => simulated::current(),
            Cpus::Fixed(c) => c,
            Cpus::Custom(f) => f(),
        }
    }

    /// The calling thread's CPU folded into a topology's range.
    #[inline(always)]
    pub fn current_in(&self, topo: &Topology) -> usize {
        topo.fold(self.current())
    }
}

impl CpuSource for Cpus {
    #[inline(always)]
    fn current_cpu(&self) -> usize {
        self.current()
    }
}

#[cfg(feature = "std")]
pub use simulated::{bind_simulated_cpu, simulated_cpu_binding};

#[cfg(feature = "std")]
mod simulated {
    extern crate std;
    use core::cell::Cell;
    use core::sync::atomic::{AtomicUsize, Ordering};

    const UNBOUND: usize = usize::MAX;
    static NEXT: AtomicUsize = AtomicUsize::new(0);

    #[cfg(not(loom))]
    std::thread_local! {
        static CPU: Cell<usize> = const { Cell::new(UNBOUND) };
    }

    // loom runs its threads as coroutines on one OS thread, where a std
    // thread-local would be one binding shared by every modelled thread: the
    // binding is loom's thread-local there (same `with`), one per loom thread.
    #[cfg(loom)]
    loom::thread_local! {
        static CPU: Cell<usize> = Cell::new(UNBOUND);
    }

    #[inline(always)]
    pub fn current() -> usize {
        let c = CPU.with(|c| c.get());
        if c != UNBOUND {
            c
        } else {
            assign()
        }
    }

    #[cold]
    fn assign() -> usize {
        let c = NEXT.fetch_add(1, Ordering::Relaxed);
        CPU.with(|cell| cell.set(c));
        c
    }

    /// Makes the calling thread act as CPU `cpu` for [`Cpus::Simulated`](super::Cpus::Simulated).
    pub fn bind_simulated_cpu(cpu: usize) {
        CPU.with(|c| c.set(cpu));
    }

    /// The simulated CPU bound to the calling thread, if any.
    pub fn simulated_cpu_binding() -> Option<usize> {
        let c = CPU.with(|c| c.get());
        (c != UNBOUND).then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_layout() {
        let t = Topology::uniform(16, 2, 2).unwrap();
        assert_eq!((t.cpus(), t.packages(), t.nodes()), (16, 2, 2));
        assert_eq!(t.package_of(7), 0);
        assert_eq!(t.package_of(8), 1);
        assert_eq!(t.cpus_on_package(1), 8);
        assert_eq!(t.cpus_on_node(0), 8);
        assert_eq!(t.fold(17), 1);
        assert_eq!(t.package_of(17), 0);
        let t = Topology::uniform(5, 2, 1).unwrap();
        assert_eq!(t.cpus_on_package(0) + t.cpus_on_package(1), 5);
    }

    #[test]
    fn bad_configs() {
        assert!(Topology::uniform(0, 1, 1).is_err());
        assert!(Topology::uniform(4, 5, 1).is_err());
        assert!(Topology::uniform(4, 1, 0).is_err());
        assert!(Topology::uniform(MAX_CPUS + 1, 1, 1).is_err());
        assert!(Topology::from_fn(4, |c| (c * 2, 0)).is_err());
    }

    #[cfg(feature = "std")]
    #[test]
    fn simulated_binding() {
        extern crate std;
        let h = std::thread::spawn(|| {
            bind_simulated_cpu(13);
            (Cpus::Simulated.current(), simulated_cpu_binding())
        });
        assert_eq!(h.join().unwrap(), (13, Some(13)));
        let t = Topology::uniform(16, 2, 1).unwrap();
        let h = std::thread::spawn(move || {
            bind_simulated_cpu(20);
            Cpus::Simulated.current_in(&t)
        });
        assert_eq!(h.join().unwrap(), 4);
        assert_eq!(Cpus::Fixed(3).current(), 3);
        fn seven() -> usize {
            7
        }
        assert_eq!(Cpus::Custom(seven).current(), 7);
        let sys = Topology::from_system();
        assert!(Cpus::Real.current_in(&sys) < sys.cpus());
    }
}
