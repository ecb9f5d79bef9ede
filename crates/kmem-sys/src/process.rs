//! Running a program and measuring it: wall time, CPU times and peak resident
//! memory of the child, from `wait4`'s resource usage (for the suites that
//! run whole programs under different allocators).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::clock::now_ns;

/// What a finished child cost and printed.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Exit code (None if killed by a signal).
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Wall-clock time from spawn to exit.
    pub wall: Duration,
    /// User CPU time of the child.
    pub user: Duration,
    /// System CPU time of the child.
    pub system: Duration,
    /// Peak resident set size of the child, in bytes.
    pub max_rss: u64,
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr.
    pub stderr: Vec<u8>,
}

impl Measured {
    /// True when it exited with status 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000)
}

/// Runs `cmd` to completion with stdout and stderr captured, and measures it.
pub fn run_measured(cmd: &mut Command) -> std::io::Result<Measured> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = now_ns();
    let mut child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let err_thread = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = err_pipe.read_to_end(&mut e);
        e
    });
    let mut stdout = Vec::new();
    let _ = out_pipe.read_to_end(&mut stdout);
    let stderr = err_thread.join().unwrap_or_default();
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child; both out-pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let wall = Duration::from_nanos(now_ns() - t0);
    // The child is reaped; keep std from trying again.
    std::mem::forget(child);
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    Ok(Measured {
        code,
        signal,
        wall,
        user: tv(ru.ru_utime),
        system: tv(ru.ru_stime),
        max_rss: ru.ru_maxrss as u64 * 1024,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_child() {
        let m =
            run_measured(Command::new("sh").args(["-c", "echo hi; echo err >&2; exit 3"])).unwrap();
        assert_eq!(m.code, Some(3));
        assert_eq!(m.stdout, b"hi\n");
        assert_eq!(m.stderr, b"err\n");
        assert!(m.max_rss > 0);
        let k = run_measured(Command::new("sh").args(["-c", "kill -9 $$"])).unwrap();
        assert_eq!(k.signal, Some(9));
        assert!(!k.success());
    }
}
