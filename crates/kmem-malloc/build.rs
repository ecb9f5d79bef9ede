//! Links the unwinder into `libkmem_malloc.so` statically on GNU/Linux.
//!
//! Rust's std refers to `_Unwind_*` (for backtraces and landing pads, even
//! with `panic = "abort"`), which it takes from `libgcc_s.so.1`. A preloaded
//! malloc would load that library into every process it runs in: about
//! 100 KiB of resident pages in a program that never needed it. Taken from
//! `libgcc_eh.a` first, the symbols bind inside the library (the cdylib's
//! version script keeps them local), and `--as-needed` drops `libgcc_s`.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
