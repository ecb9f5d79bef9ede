//! What the tests that run programs under `LD_PRELOAD` share: the library
//! built for this test run, scratch directories, a C compiler.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn lib() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_lib).clone()
}

/// `cargo test` builds this crate as an rlib only, so the test builds the
/// `cdylib` itself, with the profile and target directory of this run:
/// target/<profile>/deps/real_programs-<hash> -> target/<profile>/.
fn build_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let target = dir.parent().expect("target root");
    let profile = dir.file_name().and_then(|n| n.to_str()).expect("profile");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(["build", "-p", "kmem-malloc", "--lib"])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target);
    match profile {
        "debug" => {}
        "release" => {
            c.arg("--release");
        }
        p => {
            c.args(["--profile", p]);
        }
    }
    let o = c.output().expect("run cargo");
    assert!(
        o.status.success(),
        "building libkmem_malloc.so failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let so = dir.join("libkmem_malloc.so");
    assert!(so.exists(), "{} is missing after the build", so.display());
    so
}

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kmem-malloc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Compiles one C file with `-O2 -pthread` into `d`.
pub fn compile(name: &str, src: &Path, d: &Path) -> PathBuf {
    compile_with(name, src, d, &[])
}

/// As [`compile`], with more flags for `cc`.
pub fn compile_with(name: &str, src: &Path, d: &Path, extra: &[&str]) -> PathBuf {
    let exe = d.join(name);
    let o = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        // After the source: libraries (`-lm`) link only what it needs.
        .args(extra)
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}
