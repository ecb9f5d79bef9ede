//! A description of the machine, for benchmark reports.

use crate::{cache_info, cpu, page_size, read_topology};

/// What a benchmark report says about where it ran.
#[derive(Clone, Debug)]
pub struct MachineInfo {
    /// CPU model name from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub online_cpus: usize,
    /// Possible CPUs, packages and NUMA nodes from `/sys`.
    pub cpus: usize,
    /// CPU packages.
    pub packages: usize,
    /// NUMA nodes.
    pub nodes: usize,
    /// Base page size.
    pub page_size: usize,
    /// Cache line size.
    pub cache_line: usize,
    /// L2 size in bytes.
    pub l2_size: usize,
    /// L2 associativity.
    pub l2_ways: usize,
    /// How the current CPU is read.
    pub cpu_id_method: &'static str,
    /// Kernel release (`uname -r`).
    pub kernel: String,
}

/// Describes this machine.
pub fn machine_info() -> MachineInfo {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let topo = read_topology();
    let cache = cache_info();
    MachineInfo {
        cpu_model,
        online_cpus: cpu::online_cpus(),
        cpus: topo.cpus.len(),
        packages: topo.packages,
        nodes: topo.nodes,
        page_size: page_size(),
        cache_line: cache.line_size,
        l2_size: cache.l2_size,
        l2_ways: cache.l2_ways,
        cpu_id_method: cpu::cpu_id_method().name(),
        kernel,
    }
}
