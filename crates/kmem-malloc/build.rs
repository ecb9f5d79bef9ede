//! Links the C library into `libkmem_malloc.so`.
//!
//! The preload library is `no_std` (see the crate docs), so nothing else asks
//! the linker for libc: without `-lc` the library would have no `NEEDED`
//! entry and no symbol versions, and the functions glibc keeps in
//! `libc_nonshared.a` (`atexit`) would stay undefined.
//!
//! The library is marked `NODELETE`: a `dlclose` must not unmap the code that
//! owns every block it handed out, nor the pthread key destructor that
//! threads still run at exit.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-link-lib=c");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
