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
//!
//! An unknown option is named in one line on stderr and otherwise ignored.

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
}

impl Options {
    /// The defaults: nta with front caches, silent.
    pub const DEFAULT: Options = Options {
        stats: false,
        verbose: false,
        engine: Engine::Nta,
        front_cache: true,
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
                b"engine=nta" => o.engine = Engine::Nta,
                b"engine=pow2" => o.engine = Engine::Pow2,
                _ => unknown(tok),
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
            let name = core::str::from_utf8(tok).unwrap_or("(not UTF-8)");
            crate::out::say!("kmem: KMEM_OPTIONS: unknown option '{name}' ignored (known: stats, verbose, nocache, engine=nta, engine=pow2)");
        })
    }
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
        assert!(o.stats && !o.verbose && !o.front_cache);
        assert_eq!(o.engine, Engine::Pow2);
        assert_eq!(Options::parse(b"", |_| panic!()), Options::DEFAULT);
    }
}
