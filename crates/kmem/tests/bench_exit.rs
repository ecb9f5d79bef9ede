//! `kmem bench` is loud when it measures nothing: the JSON carries `notes`
//! and `skipped`, and the exit status is non-zero. These run the real binary
//! with a PATH or a target directory that lacks what a suite needs, and
//! without `CARGO` in the environment: as on a benchmark machine, where
//! `kmem` runs without cargo (under cargo it would build the preload library).

use std::path::PathBuf;
use std::process::{Command, Output};

/// A fresh, empty directory under the system's temporary directory.
fn empty_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kmem-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn notes(j: &serde_json::Value) -> Vec<String> {
    j["notes"]
        .as_array()
        .expect("a notes array")
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn webserver_without_wrk_says_so_and_fails() {
    let path = empty_dir("nowrk");
    let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
        .env_remove("CARGO")
        .args(["bench", "webserver", "--smoke", "--json"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let j = json(&o);
    assert!(
        notes(&j).iter().any(|n| n.contains("wrk")),
        "{:?}",
        j["notes"]
    );
    assert_eq!(j["results"], serde_json::json!([]));
    assert!(j["skipped"][0]["why"].as_str().unwrap().contains("wrk"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("measured nothing"), "{err}");
    std::fs::remove_dir_all(&path).unwrap();
}

#[test]
fn malloc_without_the_preload_library_says_how_to_build_it_and_fails() {
    // The binary alone in a directory, and a target directory without the
    // library: nowhere to find libkmem_malloc.so.
    let bin = empty_dir("nolib-bin");
    let target = empty_dir("nolib-target");
    let kmem = bin.join("kmem");
    std::fs::copy(env!("CARGO_BIN_EXE_kmem"), &kmem).unwrap();
    let o = Command::new(&kmem)
        .env_remove("CARGO")
        .args(["bench", "malloc", "--smoke", "--json"])
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let j = json(&o);
    assert!(
        notes(&j)
            .iter()
            .any(|n| n.contains("cargo build --release -p kmem-malloc")),
        "{:?}",
        j["notes"]
    );
    assert_eq!(j["results"], serde_json::json!([]));
    std::fs::remove_dir_all(&bin).unwrap();
    std::fs::remove_dir_all(&target).unwrap();
}

#[test]
fn options_a_suite_ignores_are_refused() {
    for (suite, flag) in [
        ("malloc", "--threads"),
        ("webserver", "--cpus"),
        ("core", "--cpus"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
            .env_remove("CARGO")
            .args(["bench", suite, "--smoke", flag, "2"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{suite} {flag}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("does not use {flag}")), "{err}");
        assert!(o.stdout.is_empty(), "{suite} ran");
    }
}

#[test]
fn cases_are_refused_where_a_suite_has_none_of_that_name() {
    for (suite, case, says) in [
        ("core", "anything", "runs whole and does not take --case"),
        ("malloc", "nope", "has no case \"nope\""),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
            .env_remove("CARGO")
            .args(["bench", suite, "--smoke", "--case", case])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{suite} {case}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{err}");
        assert!(o.stdout.is_empty(), "{suite} ran");
    }
}

#[test]
fn a_suite_that_measures_succeeds_with_notes_in_its_json() {
    let o = Command::new(env!("CARGO_BIN_EXE_kmem"))
        .env_remove("CARGO")
        .args(["bench", "core", "--smoke", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let j = json(&o);
    assert!(j["notes"].is_array() && j["skipped"].is_array(), "{j}");
    assert!(!j["results"].as_array().unwrap().is_empty());
}
