//! Running whole programs under different allocators through `LD_PRELOAD`:
//! which allocators are installed, finding kmem's own `libkmem_malloc.so`
//! (built beforehand: no cargo at run time), and compiling the C workloads of `crates/kmem-malloc/workloads/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::output::Skip;

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
    launch_line(stdout, "maxrss_kb").map(|kb| kb * 1024)
}

/// The CPU time (user and system, all threads) that `workloads/launch.c`
/// reports for the program it ran, in seconds.
pub fn launched_cpu_s(stdout: &[u8]) -> Option<f64> {
    launch_line(stdout, "cpu_us").map(|us| us as f64 / 1e6)
}

/// The number on the launcher's last `launch: NAME N` line.
fn launch_line(stdout: &[u8], name: &str) -> Option<u64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("launch: ")?
                .strip_prefix(name)?
                .strip_prefix(' ')
        })
        .and_then(|v| v.trim().parse::<u64>().ok())
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

/// The installed peers, and a skip (what to install) for each missing one.
pub fn installed_peers() -> (Vec<Preload>, Vec<Skip>) {
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
            None => missing.push(Skip {
                what: name.to_string(),
                why: format!("{file} is not installed (apt-get install {pkg})"),
            }),
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

/// The file name of kmem's preload library.
pub const KMEM_MALLOC_LIB: &str = "libkmem_malloc.so";

/// The command that builds [`KMEM_MALLOC_LIB`] where [`find_kmem_malloc`] looks.
pub const BUILD_KMEM_MALLOC: &str = "cargo build --release -p kmem-malloc";

/// Where [`find_kmem_malloc`] looks, in order: beside the running binary
/// (and beside its profile directory, for tests and examples, which run from
/// `deps/` and `examples/`), then the workspace's target directory
/// (`$CARGO_TARGET_DIR`, or `target/` of the workspace this binary was built
/// from): the running binary's profile, then `release`.
pub fn kmem_malloc_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let exe_dir = build_dir();
    if let Some(d) = &exe_dir {
        dirs.push(d.clone());
        if matches!(
            d.file_name().and_then(|n| n.to_str()),
            Some("deps" | "examples")
        ) {
            dirs.extend(d.parent().map(Path::to_path_buf));
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let profile = dirs
        .last()
        .and_then(|d| d.file_name())
        .map(|n| n.to_os_string());
    for p in profile.into_iter().chain(Some("release".into())) {
        dirs.push(target.join(p));
    }
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = d.canonicalize().unwrap_or_else(|_| d.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    dirs
}

/// kmem's preload library, `libkmem_malloc.so`, in the first of `dirs` that
/// holds it; when none does, a message that says where it looked and the
/// command that builds it. Nothing is built here.
pub fn find_kmem_malloc_in(dirs: &[PathBuf]) -> Result<PathBuf, String> {
    dirs.iter()
        .map(|d| d.join(KMEM_MALLOC_LIB))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            format!(
                "{KMEM_MALLOC_LIB} is not built (looked in {}): build it with `{BUILD_KMEM_MALLOC}`",
                looked.join(", ")
            )
        })
}

/// kmem's preload library, from [`kmem_malloc_dirs`]: see [`find_kmem_malloc_in`].
///
/// When `kmem` was started by cargo (`cargo run`, which sets `CARGO`), the
/// library is first built (or brought up to date) through the workspace,
/// beside the binary, with the binary's profile: so the README's
/// `cargo run --release` measures the library of the sources it runs. Without
/// cargo (a benchmark machine with the release binaries copied over) nothing
/// is built: the library must sit beside the binary.
pub fn find_kmem_malloc() -> Result<PathBuf, String> {
    if let Some(cargo) = std::env::var_os("CARGO") {
        build_kmem_malloc(Path::new(&cargo))?;
    }
    find_kmem_malloc_in(&kmem_malloc_dirs())
}

/// Builds kmem-malloc with `cargo` into the target directory of the running
/// binary, with its profile.
fn build_kmem_malloc(cargo: &Path) -> Result<(), String> {
    let dir = build_dir().ok_or("cannot locate the running binary")?;
    // Tests and examples run from deps/ and examples/ inside the profile.
    let dir = match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps" | "examples") => dir.parent().map_or(dir.clone(), Path::to_path_buf),
        _ => dir,
    };
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(p) => p.to_string(),
        None => "release".to_string(),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "kmem-malloc",
            "--profile",
            &profile,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", dir.parent().unwrap_or(&dir))
        .output()
        .map_err(|e| format!("running cargo to build kmem-malloc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "building kmem-malloc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The workloads' source directory.
pub fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kmem-malloc/workloads")
}

/// Compiles `workloads/<name>.c` with `gcc -O2 -pthread ... -lm` (once, unless the
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
            // rptest's size distributions (sqrt, log, exp).
            .arg("-lm")
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

/// A warning when the library's TLS slot (the GOT word every `malloc` and
/// `free` reads first) has the low 12 address bits of the slab header's
/// bytes that every tiny allocation and free writes
/// (`kmem_nta::slab::SLAB_HOT_BYTES`): those loads then wait on the stores
/// (4K aliasing), 1.5x the time of tiny-heavy workloads for the same
/// instructions. Where the GOT lands moves with the code's size, so a
/// change anywhere can cause it; `None` when it does not, or when `readelf`
/// (binutils) cannot say.
pub fn tls_slot_aliasing(lib: &std::path::Path) -> Option<String> {
    let o = std::process::Command::new("readelf")
        .args(["-r", "-W"])
        .arg(lib)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let slot = text
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("R_X86_64_TPOFF64"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|a| u64::from_str_radix(a, 16).ok())?;
    let at = aliases(slot, kmem_nta::slab::SLAB_HOT_BYTES)?;
    let hot = kmem_nta::slab::SLAB_HOT_BYTES;
    Some(format!(
        "WARNING: {}'s TLS slot in its GOT lies at page offset {at:#x}, among the slab header's hot bytes {:#x}..{:#x}: every tiny malloc and free reads it after their stores (4K aliasing, up to 1.5x their time); move the header's hot fields (kmem-nta's slab.rs) or the GOT",
        lib.display(),
        hot.start,
        hot.end
    ))
}

/// The page offset of the 8-byte word at `slot` when it overlaps `hot`
/// (offsets in a page).
fn aliases(slot: u64, hot: core::ops::Range<usize>) -> Option<usize> {
    let at = (slot & 0xfff) as usize;
    (at + 8 > hot.start && at < hot.end).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GOT word is flagged when any of its 8 bytes shares a page offset
    /// with the slab header's hot bytes, and only then.
    #[test]
    fn a_tls_slot_among_the_hot_bytes_is_flagged() {
        // The layout that ran tiny requests 1.5x slower: the slot at page
        // offset 8, `free` and `used` at 0..12.
        assert_eq!(aliases(0x5_8008, 0..12), Some(8));
        assert_eq!(aliases(0x5_8008, 44..56), None);
        assert_eq!(aliases(0x5_7e88, 0..12), None);
        assert_eq!(
            aliases(0x5_8028, 44..56),
            Some(0x28),
            "its last bytes overlap"
        );
        assert_eq!(aliases(0x5_8024, 44..56), None);
        assert_eq!(aliases(0x5_8038, 44..56), None);
        assert_eq!(aliases(0x5_8030, 44..56), Some(0x30));
    }

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
        let cpu = launched_cpu_s(&m.stdout).expect("the launcher's CPU line");
        assert!((0.0..1.0).contains(&cpu), "true's CPU time: {cpu} s");
        // Started straight from here, `true` reports 256 MiB or more on
        // Linux (the peak of the image its exec replaced).
        assert!(peak > 0 && peak < 64 << 20, "true's peak: {peak} bytes");
        drop(big);
    }

    #[test]
    fn the_preload_library_is_found_in_the_first_dir_that_has_it() {
        let base = std::env::temp_dir().join(format!("kmem-find-lib-{}", std::process::id()));
        let (a, b, c) = (base.join("a"), base.join("b"), base.join("c"));
        for d in [&a, &b, &c] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(b.join(KMEM_MALLOC_LIB), b"").unwrap();
        std::fs::write(c.join(KMEM_MALLOC_LIB), b"").unwrap();
        let dirs = [a.clone(), b.clone(), c];
        assert_eq!(find_kmem_malloc_in(&dirs), Ok(b.join(KMEM_MALLOC_LIB)));
        let e = find_kmem_malloc_in(&dirs[..1]).unwrap_err();
        assert!(e.contains(BUILD_KMEM_MALLOC), "{e}");
        assert!(e.contains(&a.display().to_string()), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_binarys_own_dir_comes_first() {
        let dirs = kmem_malloc_dirs();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(dirs.first().map(PathBuf::as_path), exe.parent());
        assert!(dirs.iter().any(|d| d.ends_with("release")), "{dirs:?}");
    }

    #[test]
    fn launch_line_parses() {
        assert_eq!(
            launched_max_rss(b"checksum 1\nlaunch: maxrss_kb 12\n"),
            Some(12 << 10)
        );
        assert_eq!(launched_max_rss(b"checksum 1\n"), None);
        let out = b"checksum 1\nlaunch: cpu_us 1250000\nlaunch: maxrss_kb 12\n";
        assert_eq!(launched_cpu_s(out), Some(1.25));
        assert_eq!(launched_cpu_s(b"checksum 1\n"), None);
    }
}
