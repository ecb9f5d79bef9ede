//! Lines to stderr without allocating: a fixed buffer that implements
//! `fmt::Write` and goes out with one `write(2)`.

use core::fmt;

/// A line being built; [`Line::emit`] writes it to stderr.
pub(crate) struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    pub(crate) const fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    /// Writes what was formatted (cut at the buffer's end) to fd 2.
    pub(crate) fn emit(&self) {
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

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Formats one line (a newline is added) and writes it to stderr.
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut l = $crate::out::Line::new();
        let _ = core::fmt::Write::write_fmt(&mut l, format_args!($($arg)*));
        let _ = core::fmt::Write::write_str(&mut l, "\n");
        l.emit();
    }};
}
pub(crate) use say;

/// The one line for bad input that cannot be returned as an error (a `free`
/// of a pointer that is not live), then `abort()`.
#[cold]
#[inline(never)]
pub(crate) fn die(what: &str, ptr: *const u8, why: &dyn fmt::Display) -> ! {
    say!("kmem: {what}({ptr:p}): {why}; aborting");
    // SAFETY: abort never returns and needs no precondition.
    unsafe { libc::abort() }
}
