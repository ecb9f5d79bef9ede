//! `KMEM_OPTIONS`: a comma-separated list read once, at initialisation,
//! straight from the environment block (no allocation).
//!
//! | option          | effect                                                  |
//! |-----------------|---------------------------------------------------------|
//! | `stats`         | print statistics to stderr when the process exits       |
//! | `verbose`       | print one line at initialisation (engine, CPU source, reservations) |
//! | `engine=nta`    | the default: nta heaps with per-thread front caches     |
//! | `engine=pow2`   | seed 003's power-of-two slab baseline for sizes below the large threshold |
//! | `nocache`       | no per-thread front cache: every call is the seed's nta path |
//! | `nomove`        | `realloc` copies large blocks instead of having the kernel move their pages (`mremap`; each moved block is a mapping of its own) |
//! | `retain=N`      | freed bytes kept backed with no time limit, per source (`K`, `M`, `G` suffixes; default 4M) |
//! | `decay=MS`      | milliseconds within which freed memory past `retain` goes back to the OS (default 1000; 0: at once) |
//! | `debug`, `debug=N` | junk on allocation and free, a canary after every block checked on free, `check()` of every allocator every N calls of a thread (default 65536; 0: never) |
//! | `secure`        | guard pages after large blocks, front-cache chunks in random order and checked on every pop |
//!
//! The hardening modes (`debug`, `secure`, both allowed) are described in
//! [`crate::harden`]; the nine bad inputs that abort with one line are
//! caught in every mode.
//!
//! The memory-return policy ([`kmem_core::ReturnPolicy`]), in one sentence:
//! freed memory stays backed for reuse up to `retain` bytes in each of
//! nta's region and the large arena; what is freed beyond that and not
//! reused goes back to the OS within `decay` milliseconds, at the first
//! allocator slow path after it (no background thread), and at once when it
//! passes eight times `retain` or the memory in use, whichever is larger;
//! and when a block takes pages not backed, freed ones go back as far as
//! they would take the large arena's or the page supply's footprint more
//! than a sixth of the memory in use (or `retain`) past the most in use
//! seen. `malloc_trim(0)` gives everything back at once.
//!
//! An unknown option or a bad value is named in one line on stderr and
//! otherwise ignored.

use kmem_core::ReturnPolicy;

/// The engine that serves requests below the large threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// kmem-nta (the default).
    Nta,
    /// The power-of-two slab baseline (kmem-pow2).
    Pow2,
}

/// Parsed `KMEM_OPTIONS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Print statistics at exit.
    pub stats: bool,
    /// Print a line at initialisation.
    pub verbose: bool,
    /// Which engine serves small and medium requests.
    pub engine: Engine,
    /// Use the per-thread front cache.
    pub front_cache: bool,
    /// When freed memory goes back to the OS.
    pub policy: ReturnPolicy,
    /// Debug mode: junk, canaries, and `check()` every `check_every` calls
    /// of a thread (0: never).
    pub debug: bool,
    /// Calls of one thread between two full checks in debug mode.
    pub check_every: u32,
    /// Secure mode: guard pages, random order, checked pops.
    pub secure: bool,
    /// `realloc` may have the kernel move a large block's pages.
    pub move_pages: bool,
}

impl Options {
    /// The defaults: nta with front caches, silent.
    pub const DEFAULT: Options = Options {
        stats: false,
        verbose: false,
        engine: Engine::Nta,
        front_cache: true,
        policy: ReturnPolicy::DEFAULT,
        debug: false,
        check_every: 1 << 16,
        secure: false,
        move_pages: true,
    };

    /// Parses `s`; `unknown` is called with each option it does not know.
    pub fn parse(s: &[u8], mut unknown: impl FnMut(&[u8])) -> Options {
        let mut o = Options::DEFAULT;
        for tok in s.split(|&b| b == b',') {
            let tok = tok.trim_ascii();
            match tok {
                b"" => {}
                b"stats" => o.stats = true,
                b"verbose" => o.verbose = true,
                b"nocache" => o.front_cache = false,
                b"nomove" => o.move_pages = false,
                b"engine=nta" => o.engine = Engine::Nta,
                b"engine=pow2" => o.engine = Engine::Pow2,
                b"debug" => o.debug = true,
                b"secure" => o.secure = true,
                _ => match tok
                    .iter()
                    .position(|&b| b == b'=')
                    .map(|i| (&tok[..i], &tok[i + 1..]))
                {
                    Some((b"retain", v)) => match parse_size(v) {
                        Some(n) => o.policy.retain = n,
                        None => unknown(tok),
                    },
                    Some((b"debug", v)) => {
                        match parse_size(v).and_then(|n| u32::try_from(n).ok()) {
                            Some(n) => {
                                o.debug = true;
                                o.check_every = n;
                            }
                            None => unknown(tok),
                        }
                    }
                    Some((b"decay", v)) => {
                        match parse_size(v).and_then(|n| u32::try_from(n).ok()) {
                            Some(ms) => o.policy.delay_ms = ms,
                            None => unknown(tok),
                        }
                    }
                    _ => unknown(tok),
                },
            }
        }
        o
    }

    /// Reads `KMEM_OPTIONS` from the environment (without allocating).
    pub(crate) fn from_env() -> Options {
        // SAFETY: getenv with a NUL-terminated name; the result, when not
        // null, is a NUL-terminated string that lives in the environment.
        let p = unsafe { libc::getenv(c"KMEM_OPTIONS".as_ptr()) };
        if p.is_null() {
            return Options::DEFAULT;
        }
        // SAFETY: as above.
        let s = unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes();
        Options::parse(s, |tok| {
            // At most NAME_MAX bytes of it, cut at a character boundary, so
            // that the line (and its newline) always fits.
            let shown = &tok[..tok.len().min(NAME_MAX)];
            let name = match core::str::from_utf8(shown) {
                Ok(n) => n,
                Err(e) => core::str::from_utf8(&shown[..e.valid_up_to()]).unwrap_or(""),
            };
            let more = if shown.len() < tok.len() { "..." } else { "" };
            let what = if tok.starts_with(b"retain=")
                || tok.starts_with(b"decay=")
                || tok.starts_with(b"debug=")
            {
                "bad value in option"
            } else {
                "unknown option"
            };
            crate::out::say!("kmem: KMEM_OPTIONS: {what} '{name}{more}' ignored (known: stats, verbose, nocache, nomove, engine=nta, engine=pow2, retain=BYTES[K|M|G], decay=MS, debug[=N], secure)");
        })
    }
}

/// Longest option name an error message repeats.
const NAME_MAX: usize = 64;

/// `123`, `64K`, `4M`, `1G` (binary multiples; case-insensitive).
fn parse_size(v: &[u8]) -> Option<usize> {
    let (digits, shift) = match v.last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 10),
        b'm' | b'M' => (&v[..v.len() - 1], 20),
        b'g' | b'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: usize = 0;
    for &d in digits {
        n = n.checked_mul(10)?.checked_add((d - b'0') as usize)?;
    }
    n.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_and_reports_unknown() {
        let mut bad = 0;
        let o = Options::parse(b" stats ,engine=pow2,,bogus,nocache", |t| {
            assert_eq!(t, b"bogus");
            bad += 1;
        });
        assert_eq!(bad, 1);
        assert!(o.stats && !o.verbose && !o.front_cache && o.move_pages);
        assert!(!Options::parse(b"nomove", |_| panic!()).move_pages);
        assert_eq!(o.engine, Engine::Pow2);
        assert_eq!(Options::parse(b"", |_| panic!()), Options::DEFAULT);
    }

    #[test]
    fn parses_the_return_policy() {
        let o = Options::parse(b"retain=64K,decay=250", |t| panic!("{t:?}"));
        assert_eq!(o.policy.retain, 64 << 10);
        assert_eq!(o.policy.delay_ms, 250);
        let o = Options::parse(b"retain=0,decay=0", |t| panic!("{t:?}"));
        assert_eq!(o.policy, kmem_core::ReturnPolicy::EAGER);
        assert_eq!(
            Options::parse(b"retain=2g", |_| panic!()).policy.retain,
            2 << 30
        );
        let mut bad = 0;
        let o = Options::parse(
            b"retain=,retain=4X,decay=-1,decay=99999999999,retain=99999999999999999999G",
            |_| bad += 1,
        );
        assert_eq!(bad, 5);
        assert_eq!(o.policy, kmem_core::ReturnPolicy::DEFAULT);
    }

    #[test]
    fn parses_the_hardening_modes() {
        let o = Options::parse(b"debug,secure", |t| panic!("{t:?}"));
        assert!(o.debug && o.secure);
        assert_eq!(o.check_every, 1 << 16);
        let o = Options::parse(b"debug=0", |t| panic!("{t:?}"));
        assert!(o.debug && !o.secure);
        assert_eq!(o.check_every, 0);
        assert_eq!(Options::parse(b"debug=1K", |_| panic!()).check_every, 1024);
        let mut bad = 0;
        let o = Options::parse(b"debug=x,debug=99999999999,secure=1", |_| bad += 1);
        assert_eq!(bad, 3);
        assert!(!o.debug && !o.secure);
    }
}
