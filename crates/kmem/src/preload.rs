//! Running whole programs under different allocators through `LD_PRELOAD`:
//! which allocators are installed, building kmem's own `libkmem_malloc.so`,
//! and compiling the C workloads of `crates/kmem-malloc/workloads/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// An allocator a program can run under.
#[derive(Clone, Debug)]
pub struct Preload {
    /// Name in reports: `glibc`, `kmem`, `jemalloc`...
    pub name: String,
    /// The shared object to preload (None: the C library's own malloc).
    pub lib: Option<PathBuf>,
    /// Extra environment for the run (e.g. `KMEM_OPTIONS`).
    pub env: Vec<(String, String)>,
}

impl Preload {
    /// A command for `program` that runs under this allocator.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        if let Some(lib) = &self.lib {
            c.env("LD_PRELOAD", lib);
        } else {
            c.env_remove("LD_PRELOAD");
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// A command that runs `program` under this allocator through
    /// `launcher` (`workloads/launch.c`), which reports the program's own
    /// peak RSS: see [`launched_max_rss`].
    pub fn launched(&self, launcher: &Path, program: &Path) -> Command {
        let mut c = Command::new(launcher);
        c.arg(program).env_remove("LD_PRELOAD");
        match &self.lib {
            Some(lib) => c.env("KMEM_LAUNCH_PRELOAD", lib),
            None => c.env_remove("KMEM_LAUNCH_PRELOAD"),
        };
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }
}

/// The peak RSS in bytes that `workloads/launch.c` printed for its program.
///
/// Linux carries a process's peak RSS across exec and counts in the peak of
/// the image the exec replaced, so a program started straight from the
/// driver reports at least the driver's own peak (hundreds of MiB after
/// the other suites); the launcher's child replaces only the launcher.
pub fn launched_max_rss(stdout: &[u8]) -> Option<u64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("launch: maxrss_kb "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The peers Debian packages, where they install, and the package to ask for.
pub const PEERS: &[(&str, &str, &str)] = &[
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2"),
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0"),
    (
        "tcmalloc",
        "libtcmalloc_minimal.so.4",
        "libtcmalloc-minimal4",
    ),
];

const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

/// The installed peers, and a note for each missing one.
pub fn installed_peers() -> (Vec<Preload>, Vec<String>) {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (name, file, pkg) in PEERS {
        match LIB_DIRS
            .iter()
            .map(|d| Path::new(d).join(file))
            .find(|p| p.exists())
        {
            Some(lib) => found.push(Preload {
                name: name.to_string(),
                lib: Some(lib),
                env: Vec::new(),
            }),
            None => missing.push(format!("{name} is not installed: apt-get install {pkg}")),
        }
    }
    (found, missing)
}

/// The directory the running `kmem` binary was built into (target/release, target/fast...).
fn build_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// Builds `libkmem_malloc.so` with the same profile as the running binary and
/// returns its path.
pub fn build_kmem_malloc() -> Result<PathBuf, String> {
    let dir = build_dir().ok_or("cannot locate the running binary")?;
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(p) => p.to_string(),
        None => "release".to_string(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "kmem-malloc",
            "--profile",
            &profile,
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", dir.parent().unwrap_or(&dir))
        .output()
        .map_err(|e| format!("running cargo to build kmem-malloc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building kmem-malloc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let lib = dir.join("libkmem_malloc.so");
    if lib.exists() {
        Ok(lib)
    } else {
        Err(format!("{} not found after the build", lib.display()))
    }
}

/// The workloads' source directory.
pub fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmem-malloc/workloads")
}

/// Compiles `workloads/<name>.c` with `gcc -O2 -pthread` (once, unless the
/// source changed) and returns the program's path.
pub fn compile_workload(name: &str) -> Result<PathBuf, String> {
    let src = workloads_dir().join(format!("{name}.c"));
    let out_dir = build_dir()
        .ok_or("cannot locate the running binary")?
        .join("kmem-workloads");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let exe = out_dir.join(name);
    let newer = |a: &Path, b: &Path| -> bool {
        match (
            a.metadata().and_then(|m| m.modified()),
            b.metadata().and_then(|m| m.modified()),
        ) {
            (Ok(x), Ok(y)) => x > y,
            _ => true,
        }
    };
    let header = workloads_dir().join("common.h");
    if !exe.exists() || newer(&src, &exe) || newer(&header, &exe) {
        // Into a private name, then renamed over the old one: another thread
        // or process may be running (or compiling) the same workload now,
        // and must never see a half-written executable.
        static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = out_dir.join(format!(".{name}.{}.{n}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
        let out = Command::new(&cc)
            .args(["-O2", "-g", "-pthread", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .map_err(|e| format!("running {cc}: {e} (install gcc)"))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!(
                "compiling {}: {}",
                src.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::rename(&tmp, &exe).map_err(|e| format!("installing {}: {e}", exe.display()))?;
    }
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_reports_the_programs_peak_not_the_drivers() {
        // Grow this process well past what the program will use, so that a
        // program started straight from it would report at least this much.
        let big = vec![1u8; 256 << 20];
        std::hint::black_box(&big);
        let launcher = compile_workload("launch").expect("gcc builds the launcher");
        let glibc = Preload {
            name: "glibc".into(),
            lib: None,
            env: Vec::new(),
        };
        let mut via = glibc.launched(&launcher, Path::new("true"));
        let m = kmem_sys::process::run_measured(&mut via).unwrap();
        assert!(m.success());
        let peak = launched_max_rss(&m.stdout).expect("the launcher's line");
        // Started straight from here, `true` reports 256 MiB or more on
        // Linux (the peak of the image its exec replaced).
        assert!(peak > 0 && peak < 64 << 20, "true's peak: {peak} bytes");
        drop(big);
    }

    #[test]
    fn launch_line_parses() {
        assert_eq!(
            launched_max_rss(b"checksum 1\nlaunch: maxrss_kb 12\n"),
            Some(12 << 10)
        );
        assert_eq!(launched_max_rss(b"checksum 1\n"), None);
    }
}
