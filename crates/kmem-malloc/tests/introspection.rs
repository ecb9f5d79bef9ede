//! glibc's introspection calls under `LD_PRELOAD`: `mallinfo2`, `mallinfo`,
//! `mallopt`, `malloc_info`, `malloc_trim`, from C and from Python's
//! `ctypes`, answer with kmem's figures.

mod common;

use common::{compile, lib, scratch};
use std::process::Command;

#[test]
fn a_c_program_reads_kmem_figures() {
    let d = scratch("introspect");
    let src = d.join("mi.c");
    std::fs::write(
        &src,
        r#"#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  struct mallinfo2 a = mallinfo2();
  void *volatile v[1000];
  for (int i = 0; i < 1000; i++) v[i] = malloc(1000);
  void *volatile big = malloc(10 << 20);
  memset(big, 1, 10 << 20);
  struct mallinfo2 b = mallinfo2();
  struct mallinfo c = mallinfo();
  /* small and medium blocks in use: 1000 of 1024 bytes (whole chunks) */
  printf("uord %d\n", b.uordblks - a.uordblks >= 1000 * 1000 && b.uordblks - a.uordblks < 1200 * 1000);
  printf("arena %d\n", b.arena >= b.uordblks + b.fordblks - 65536 && b.arena > 0);
  printf("large %d\n", b.hblks == a.hblks + 1 && b.hblkhd - a.hblkhd >= (10 << 20));
  printf("int %d\n", c.uordblks == (int)b.uordblks && c.hblks == (int)b.hblks);
  printf("mallopt %d %d %d\n", mallopt(M_TRIM_THRESHOLD, 1 << 20), mallopt(M_MMAP_THRESHOLD, 1 << 20), mallopt(12345, 1));
  for (int i = 0; i < 1000; i++) free(v[i]);
  free(big);
  struct mallinfo2 e = mallinfo2();
  printf("freed %d\n", e.uordblks < b.uordblks - 900 * 1000 && e.hblks == a.hblks);
  printf("trim %d\n", malloc_trim(0));
  struct mallinfo2 f = mallinfo2();
  printf("kept %d\n", f.keepcost == 0);
  fflush(stdout);
  printf("info %d\n", malloc_info(0, stdout));
  printf("bad %d\n", malloc_info(1, stdout));
  return 0;
}
"#,
    )
    .unwrap();
    let exe = compile("mi", &src, &d);
    let o = Command::new(&exe)
        .env("LD_PRELOAD", lib())
        .output()
        .expect("run");
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    for line in [
        "uord 1",
        "arena 1",
        "large 1",
        "int 1",
        "mallopt 1 1 0",
        "freed 1",
        "trim 1",
        "kept 1",
        "info 0",
        "bad -1",
    ] {
        assert!(
            out.lines().any(|l| l == line),
            "{line:?} missing in:\n{out}"
        );
    }
    let xml: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("<malloc"))
        .take_while(|l| !l.starts_with("info"))
        .collect();
    assert_eq!(xml.first(), Some(&"<malloc version=\"1\">"), "{out}");
    assert_eq!(xml.last(), Some(&"</malloc>"), "{out}");
    assert!(xml.iter().any(|l| l.starts_with("<total type=\"mmap\"")));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn python_ctypes_reads_mallinfo2() {
    let script = r#"
import ctypes
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MI2
a = libc.mallinfo2()
keep = [bytearray(3000) for _ in range(2000)]
big = bytearray(50 << 20)
b = libc.mallinfo2()
# uordblks counts blocks parked in the thread's front cache, which the new
# ones may reuse: of 3000 bytes, the class's base bound (16 blocks) unless
# this thread grew it by churning that size
print("small", b.uordblks - a.uordblks >= 2000 * 3000 - (1 << 20))
print("large", b.hblkhd - a.hblkhd >= 50 << 20)
del keep, big
libc.malloc_trim(0)
c = libc.mallinfo2()
print("back", c.uordblks < b.uordblks and c.hblkhd < b.hblkhd)
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("LD_PRELOAD", lib())
        .output()
        .expect("run python3");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "small True\nlarge True\nback True\n"
    );
}
