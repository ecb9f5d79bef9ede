//! The system packages the suites and tests use beyond Rust and a C
//! compiler, and installing them on Debian and Ubuntu (`kmem setup`, and
//! `kmem report` before it measures).
//!
//! Rust and a C compiler are the only prerequisites (rustc links with `cc`,
//! and the jemalloc and mimalloc crates build C). Everything else here is
//! optional: a suite that misses one says so and skips that comparison. The
//! project installs what is missing with `apt-get` when it can do so without
//! asking (root, or `sudo -n`); otherwise it prints the one line to run.

use std::path::Path;
use std::process::Command;

/// One package: how to tell it is there, and what needs it.
pub struct Package {
    /// The Debian/Ubuntu package.
    pub name: &'static str,
    /// What uses it.
    pub why: &'static str,
    present: fn() -> bool,
}

fn lib(name: &str) -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/lib",
    ]
    .iter()
    .any(|d| Path::new(d).join(name).exists())
}

/// Whether `name` is an executable file in a directory of `PATH`.
pub fn program(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            d.join(name).metadata().is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
    })
}

/// Every optional package, in the order they are installed.
pub const PACKAGES: &[Package] = &[
    Package {
        name: "libjemalloc2",
        why: "jemalloc, a peer of the malloc and webserver suites",
        present: || lib("libjemalloc.so.2"),
    },
    Package {
        name: "libmimalloc2.0",
        why: "mimalloc, a peer of the malloc and webserver suites",
        present: || lib("libmimalloc.so.2"),
    },
    Package {
        name: "libtcmalloc-minimal4",
        why: "tcmalloc, a peer of the malloc and webserver suites",
        present: || lib("libtcmalloc_minimal.so.4"),
    },
    Package {
        name: "wrk",
        why: "the load generator of the webserver suite",
        present: || program("wrk"),
    },
    Package {
        name: "g++",
        why: "libFuzzer, for the fuzz targets (fuzz/run)",
        present: || program("g++"),
    },
    Package {
        name: "python3",
        why: "a real program kmem-malloc's tests run under LD_PRELOAD",
        present: || program("python3"),
    },
    Package {
        name: "git",
        why: "a real program kmem-malloc's tests run under LD_PRELOAD",
        present: || program("git"),
    },
    Package {
        name: "qemu-system-x86",
        why: "QEMU, which boots kmem-kernel (kmem kernel, the kernel boot test, the report's kernel table)",
        present: || program("qemu-system-x86_64"),
    },
];

/// The packages that are not installed.
pub fn missing() -> Vec<&'static Package> {
    PACKAGES.iter().filter(|p| !(p.present)()).collect()
}

/// The one line that installs `pkgs`.
pub fn install_line(pkgs: &[&Package]) -> String {
    let names: Vec<&str> = pkgs.iter().map(|p| p.name).collect();
    format!(
        "sudo apt-get install -y --no-install-recommends {}",
        names.join(" ")
    )
}

/// The effective user id, from `/proc/self/status` (`Uid:` real, effective...).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// How packages can be installed here without asking anyone: as root, or
/// through `sudo -n`; None when neither works or there is no apt-get.
fn installer() -> Option<Vec<&'static str>> {
    if !program("apt-get") {
        return None;
    }
    if effective_uid() == Some(0) {
        return Some(vec![]);
    }
    let sudo_ok = program("sudo")
        && Command::new("sudo")
            .args(["-n", "true"])
            .output()
            .is_ok_and(|o| o.status.success());
    sudo_ok.then(|| vec!["sudo", "-n"])
}

/// What [`ensure`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was missing.
    AllPresent,
    /// The missing packages were installed.
    Installed(Vec<&'static str>),
    /// Some could not be installed: the message says what and how.
    Missing(String),
}

/// Installs the missing packages when that needs no one's answer (root or
/// passwordless sudo, apt-get present), printing what it runs on stderr;
/// otherwise says which are missing and the line to run. With
/// `KMEM_NO_INSTALL` set, never installs.
pub fn ensure() -> Outcome {
    let need = missing();
    if need.is_empty() {
        return Outcome::AllPresent;
    }
    let line = install_line(&need);
    let allowed = std::env::var_os("KMEM_NO_INSTALL").is_none();
    if let Some(prefix) = installer().filter(|_| allowed) {
        let names: Vec<&'static str> = need.iter().map(|p| p.name).collect();
        eprintln!(
            "kmem: installing what the suites compare with ({}); KMEM_NO_INSTALL=1 skips this",
            names.join(", ")
        );
        let run = |args: &[&str]| -> bool {
            // `env` after the prefix: sudo resets the environment. The lock
            // timeout waits for another apt (unattended upgrades) instead of
            // failing at once.
            let mut all: Vec<&str> = prefix.clone();
            all.extend_from_slice(&["env", "DEBIAN_FRONTEND=noninteractive", args[0]]);
            all.extend_from_slice(&["-o", "DPkg::Lock::Timeout=300"]);
            all.extend_from_slice(&args[1..]);
            // apt's and dpkg's chatter goes to stderr: stdout carries the
            // report (or `--json`).
            Command::new(all[0])
                .args(&all[1..])
                .stdout(std::io::stderr())
                .status()
                .is_ok_and(|s| s.success())
        };
        // Without recommends: qemu-system-x86's (a GUI, firmware for other
        // machines) are large and nothing here uses them; no other package
        // here recommends anything the suites or tests need.
        let mut install = vec!["apt-get", "install", "-y", "-qq", "--no-install-recommends"];
        install.extend(names.iter().copied());
        if run(&["apt-get", "update", "-qq"]) && run(&install) {
            let still = missing();
            if still.is_empty() {
                return Outcome::Installed(names);
            }
            return Outcome::Missing(format!(
                "still missing after apt-get: {}; run: {}",
                still.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
                install_line(&still)
            ));
        }
        return Outcome::Missing(format!("apt-get failed; run: {line}"));
    }
    let list: Vec<String> = need
        .iter()
        .map(|p| format!("{} ({})", p.name, p.why))
        .collect();
    Outcome::Missing(format!("not installed: {}; run: {line}", list.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_line_names_every_package() {
        let all: Vec<&Package> = PACKAGES.iter().collect();
        let line = install_line(&all);
        assert!(line.starts_with("sudo apt-get install -y "));
        for p in PACKAGES {
            assert!(line.contains(p.name), "{line}");
        }
    }

    #[test]
    fn the_effective_uid_is_read() {
        assert!(effective_uid().is_some());
    }

    #[test]
    fn a_program_on_path_is_found_and_a_made_up_one_is_not() {
        assert!(program("sh"));
        assert!(!program("kmem-no-such-program-here"));
    }
}
