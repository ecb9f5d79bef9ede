//! Lines to stderr without allocating, the abort path of bad input, and the
//! panic handler of `no_std` builds (feature `panic-abort`).
//!
//! An allocator that meets a corrupted heap or a bad `free` where no error can
//! be returned must say so and stop, and it must do so without allocating
//! (the allocator is the thing that is broken) and without std's machinery
//! (which a `no_std` build does not have). A [`Line`] is a fixed buffer that
//! implements `fmt::Write` and goes out with `write(2)`.

use core::fmt;

/// A line being built in a fixed buffer; [`Line::emit`] writes it to stderr.
/// Text past the buffer's 512 bytes is cut.
pub struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    /// An empty line.
    pub const fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    /// Ends the line with a newline, which always fits: a line that filled
    /// the buffer ends in `...` and the newline instead of its last bytes.
    pub fn end_line(&mut self) {
        if self.len == self.buf.len() {
            let n = self.buf.len();
            self.buf[n - 4..].copy_from_slice(b"...\n");
        } else {
            self.buf[self.len] = b'\n';
            self.len += 1;
        }
    }

    /// What was written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Writes what was formatted to fd 2 (retrying short writes; an error
    /// drops the rest: there is nobody left to tell).
    pub fn emit(&self) {
        let mut at = 0;
        while at < self.len {
            // SAFETY: the range lies inside our buffer.
            let n =
                unsafe { libc::write(2, self.buf[at..self.len].as_ptr().cast(), self.len - at) };
            if n <= 0 {
                return;
            }
            at += n as usize;
        }
    }
}

impl Default for Line {
    fn default() -> Line {
        Line::new()
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Formats `args` and a newline into one line, writes it to stderr, and
/// aborts the process (`abort(3)`: SIGABRT, a core dump where enabled).
#[cold]
#[inline(never)]
pub fn abort_with(args: fmt::Arguments<'_>) -> ! {
    let mut l = Line::new();
    let _ = fmt::Write::write_fmt(&mut l, args);
    l.end_line();
    l.emit();
    // SAFETY: abort has no preconditions and does not return.
    unsafe { libc::abort() }
}

/// The panic handler of a `no_std` final artifact: the message and where it
/// was raised, on one line, then abort. Without unwinding there is nothing
/// else a library inside someone else's process can do.
#[cfg(all(feature = "panic-abort", not(feature = "std"), not(test)))]
#[panic_handler]
fn on_panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(at) => abort_with(format_args!(
            "kmem: panic at {}:{}: {}",
            at.file(),
            at.line(),
            info.message()
        )),
        None => abort_with(format_args!("kmem: panic: {}", info.message())),
    }
}

/// The personality routine that the precompiled `core` names in its unwind
/// tables. Nothing in a `no_std` kmem build unwinds (every crate is built
/// with `panic = "abort"`); if a foreign exception ever tried to unwind
/// through kmem's frames, stopping is the only sound answer.
///
/// The symbol is defined in assembly so that it can be hidden: a
/// `#[no_mangle]` function would be exported from a `cdylib`, and a
/// preloaded library must not offer its `rust_eh_personality` to the Rust
/// code of the program it runs in.
#[cfg(all(feature = "panic-abort", not(feature = "std"), not(test)))]
extern "C" fn no_unwinding() -> ! {
    abort_with(format_args!(
        "kmem: an exception tried to unwind through kmem's frames"
    ))
}

#[cfg(all(
    feature = "panic-abort",
    not(feature = "std"),
    not(test),
    target_arch = "x86_64"
))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality,@function",
    "rust_eh_personality:",
    "jmp {f}",
    f = sym no_unwinding,
);

#[cfg(all(
    feature = "panic-abort",
    not(feature = "std"),
    not(test),
    target_arch = "aarch64"
))]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality,%function",
    "rust_eh_personality:",
    "b {f}",
    f = sym no_unwinding,
);

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn a_line_keeps_what_fits_and_cuts_the_rest() {
        let mut l = Line::new();
        let why = "not allocated";
        write!(l, "free({:p}): {why}", 0x1000 as *const u8).unwrap();
        assert_eq!(l.as_bytes(), b"free(0x1000): not allocated");
        let long = "x".repeat(600);
        l.write_str(&long).unwrap();
        assert_eq!(l.as_bytes().len(), 512);
    }

    /// A line cut at the buffer's end still ends with its newline (it lost
    /// it before, and the next line ran on after it).
    #[test]
    fn a_cut_line_still_ends_with_a_newline() {
        let mut l = Line::new();
        l.write_str(&"y".repeat(700)).unwrap();
        l.end_line();
        assert_eq!(l.as_bytes().len(), 512);
        assert!(l.as_bytes().ends_with(b"yyy...\n"));
        let mut s = Line::new();
        s.write_str("short").unwrap();
        s.end_line();
        assert_eq!(s.as_bytes(), b"short\n");
    }
}
