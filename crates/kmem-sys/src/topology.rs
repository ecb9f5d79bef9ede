//! The CPUs, packages and NUMA nodes of this machine, read from `/sys`.
//!
//! ```text
//!   <root>/cpu/possible                              "0-15"          (else online, else the CPU count)
//!   <root>/cpu/cpuN/topology/physical_package_id     "0"             (missing: package 0)
//!   <root>/node/nodeM/cpulist                        "0-7,16-23"     (missing: node 0)
//! ```
//!
//! The parser is a pure function of a directory ([`parse_topology`]), tested on
//! fixture trees. Package and node ids are renumbered densely in order of first
//! appearance by CPU number, so that they index arrays. Missing or malformed
//! files never panic; at worst the machine is one package and one node.

use std::fs;
use std::path::Path;

/// Where one CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPlace {
    /// Dense package index (0-based).
    pub package: usize,
    /// Dense NUMA node index (0-based).
    pub node: usize,
}

/// The machine as `/sys` describes it: CPU `i` (the kernel's CPU number) is at `cpus[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysTopology {
    /// One entry per possible CPU, indexed by the kernel's CPU number.
    pub cpus: Vec<CpuPlace>,
    /// Number of packages (at least 1).
    pub packages: usize,
    /// Number of NUMA nodes (at least 1).
    pub nodes: usize,
    /// False when the layout was guessed because `/sys` could not be read.
    pub from_system: bool,
}

impl SysTopology {
    /// `cpus` CPUs in one package and one node.
    pub fn flat(cpus: usize) -> SysTopology {
        SysTopology {
            cpus: vec![
                CpuPlace {
                    package: 0,
                    node: 0
                };
                cpus.max(1)
            ],
            packages: 1,
            nodes: 1,
            from_system: false,
        }
    }
}

/// Parses a kernel CPU list such as `0-3,8,10-11`. Returns None if malformed.
/// Lists above 65536 CPUs are refused as malformed.
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let s = s.trim();
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().ok()?,
                b.trim().parse::<usize>().ok()?,
            ),
            None => {
                let v = part.parse::<usize>().ok()?;
                (v, v)
            }
        };
        if lo > hi || hi >= 65536 {
            return None;
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

fn read_list(path: &Path) -> Option<Vec<usize>> {
    parse_cpulist(&fs::read_to_string(path).ok()?)
}

/// Reads a topology from a directory laid out as `/sys/devices/system`.
/// `fallback_cpus` is used when no CPU list can be read.
pub fn parse_topology(root: &Path, fallback_cpus: usize) -> SysTopology {
    let cpu_dir = root.join("cpu");
    let list = read_list(&cpu_dir.join("possible"))
        .filter(|l| !l.is_empty())
        .or_else(|| read_list(&cpu_dir.join("online")).filter(|l| !l.is_empty()));
    let Some(list) = list else {
        return SysTopology::flat(fallback_cpus);
    };
    let ncpus = list.iter().max().map_or(1, |m| m + 1);

    // Packages, renumbered in order of first appearance.
    let mut pkg_ids: Vec<i64> = Vec::new();
    let mut raw_pkg = vec![None; ncpus];
    for &c in &list {
        let p = fs::read_to_string(cpu_dir.join(format!("cpu{c}/topology/physical_package_id")))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        raw_pkg[c] = p;
    }
    let mut cpus = vec![
        CpuPlace {
            package: 0,
            node: 0
        };
        ncpus
    ];
    for (c, p) in raw_pkg.iter().enumerate() {
        let p = p.unwrap_or(-1).max(-1);
        let idx = match pkg_ids.iter().position(|&x| x == p) {
            Some(i) => i,
            None => {
                pkg_ids.push(p);
                pkg_ids.len() - 1
            }
        };
        cpus[c].package = idx;
    }

    // Nodes: each node directory lists its CPUs.
    let mut node_dirs: Vec<(usize, Vec<usize>)> = Vec::new();
    if let Ok(rd) = fs::read_dir(root.join("node")) {
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(num) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            if let Some(l) = read_list(&e.path().join("cpulist")) {
                node_dirs.push((num, l));
            }
        }
    }
    node_dirs.sort();
    let mut node_of = vec![None::<usize>; ncpus];
    for (num, l) in &node_dirs {
        for &c in l {
            if c < ncpus && node_of[c].is_none() {
                node_of[c] = Some(*num);
            }
        }
    }
    let mut node_ids: Vec<Option<usize>> = Vec::new();
    for c in 0..ncpus {
        let n = node_of[c];
        let idx = match node_ids.iter().position(|&x| x == n) {
            Some(i) => i,
            None => {
                node_ids.push(n);
                node_ids.len() - 1
            }
        };
        cpus[c].node = idx;
    }
    SysTopology {
        cpus,
        packages: pkg_ids.len().max(1),
        nodes: node_ids.len().max(1),
        from_system: true,
    }
}

/// The topology of this machine (read from `/sys/devices/system`).
pub fn read_topology() -> SysTopology {
    parse_topology(Path::new("/sys/devices/system"), crate::cpu::online_cpus())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    struct Tree(PathBuf);
    impl Tree {
        fn new(name: &str) -> Tree {
            let p = std::env::temp_dir().join(format!("kmem-topo-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            Tree(p)
        }
        fn file(&self, rel: &str, body: &str) -> &Tree {
            let f = self.0.join(rel);
            fs::create_dir_all(f.parent().unwrap()).unwrap();
            fs::write(f, body).unwrap();
            self
        }
    }
    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
        assert_eq!(parse_cpulist("0-99999999"), None);
        assert_eq!(parse_cpulist("1,1,0"), Some(vec![0, 1]));
    }

    #[test]
    fn two_packages_two_nodes() {
        let t = Tree::new("2p2n");
        t.file("cpu/possible", "0-7\n");
        for c in 0..8 {
            t.file(
                &format!("cpu/cpu{c}/topology/physical_package_id"),
                if c < 4 { "1\n" } else { "0\n" },
            );
        }
        t.file("node/node0/cpulist", "0-3\n")
            .file("node/node1/cpulist", "4-7\n");
        let topo = parse_topology(&t.0, 1);
        assert!(topo.from_system);
        assert_eq!(topo.cpus.len(), 8);
        assert_eq!(topo.packages, 2);
        assert_eq!(topo.nodes, 2);
        // Renumbered by first appearance: CPU 0's package becomes 0.
        assert_eq!(
            topo.cpus[0],
            CpuPlace {
                package: 0,
                node: 0
            }
        );
        assert_eq!(
            topo.cpus[7],
            CpuPlace {
                package: 1,
                node: 1
            }
        );
    }

    #[test]
    fn missing_tree_is_flat() {
        let topo = parse_topology(Path::new("/nonexistent/kmem"), 3);
        assert_eq!(topo, SysTopology::flat(3));
    }

    #[test]
    fn broken_files_degrade() {
        let t = Tree::new("broken");
        t.file("cpu/possible", "garbage");
        t.file("cpu/online", "0-3");
        t.file("cpu/cpu0/topology/physical_package_id", "zero");
        t.file("cpu/cpu1/topology/physical_package_id", "0");
        t.file("node/node0/cpulist", "0-1");
        t.file("node/nodeX/cpulist", "2-3");
        t.file("node/node1/cpulist", "bad");
        let topo = parse_topology(&t.0, 1);
        assert_eq!(topo.cpus.len(), 4);
        // CPU 0 has an unreadable package, CPUs 2-3 none: they share the "unknown" package.
        assert_eq!(topo.packages, 2);
        assert_eq!(topo.cpus[0].package, topo.cpus[2].package);
        assert_ne!(topo.cpus[0].package, topo.cpus[1].package);
        // CPUs 2-3 are on no readable node.
        assert_eq!(topo.nodes, 2);
        assert_eq!(topo.cpus[0].node, 0);
        assert_eq!(topo.cpus[3].node, 1);
    }

    #[test]
    fn sparse_cpu_numbers() {
        let t = Tree::new("sparse");
        t.file("cpu/possible", "0,2");
        let topo = parse_topology(&t.0, 1);
        assert_eq!(topo.cpus.len(), 3);
        assert_eq!(topo.packages, 1);
        assert_eq!(topo.nodes, 1);
    }

    #[test]
    fn this_machine() {
        let topo = read_topology();
        assert!(!topo.cpus.is_empty());
        assert!(topo
            .cpus
            .iter()
            .all(|c| c.package < topo.packages && c.node < topo.nodes));
    }
}
