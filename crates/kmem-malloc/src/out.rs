//! Lines to stderr without allocating ([`kmem_sys::stderr::Line`]: a fixed
//! buffer that goes out with one `write(2)`), and the abort of bad input.

use core::fmt;

/// Formats one line (a newline is added) and writes it to stderr.
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut l = kmem_sys::stderr::Line::new();
        let _ = core::fmt::Write::write_fmt(&mut l, format_args!($($arg)*));
        l.end_line();
        l.emit();
    }};
}
pub(crate) use say;

/// The one line for bad input that cannot be returned as an error (a `free`
/// of a pointer that is not live), then `abort()`.
#[cold]
#[inline(never)]
pub(crate) fn die(what: &str, ptr: *const u8, why: &dyn fmt::Display) -> ! {
    kmem_sys::abort_with(format_args!("kmem: {what}({ptr:p}): {why}; aborting"))
}
