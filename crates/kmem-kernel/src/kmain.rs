//! From `long_mode` to the verdict: bring-up in dependency order, the other
//! CPUs, the tests, and the way out.
//!
//! ```text
//!   kmain (CPU 0)                          ap_main (CPU n)
//!   serial, GS -> boot area, IDT, TSS
//!   memory map -> kmem-pages -> quicklists
//!   kernel page tables (CR3)
//!   kmem-percpu -> per-CPU areas (GS)
//!   kmem-vmap arena, kmem-nta heaps
//!   per AP: stack from kmem-pages,  ---->  CR3, GS, TSS/IDT, APIC, sti
//!           INIT-SIPI-SIPI                 wait for jobs
//!   tests (jobs on every CPU)       <--->  run each job, report done
//!   JSON line, "N passed, M failed", exit
//! ```

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};

use kmem_core::Topology;

use crate::protocol::{EXIT_FAIL, EXIT_PASS, EXIT_PORT, PANIC_WORD};
use crate::{apic, jobs, kmalloc, mm, percpu, tests, trap, vmalloc, x86};

/// The most CPUs the kernel brings up.
pub const MAX_CPUS: usize = 16;

/// A value set once by the bootstrap CPU before any other CPU can read it.
pub struct Global<T> {
    state: AtomicU8,
    v: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written once, before `state` says READY (Release),
// and only read after seeing READY (Acquire); T is Sync, so shared reads from
// several CPUs are sound, and Send, since it may be set and used on different
// CPUs.
unsafe impl<T: Send + Sync> Sync for Global<T> {}

const EMPTY: u8 = 0;
const WRITING: u8 = 1;
const READY: u8 = 2;

impl<T> Global<T> {
    /// Not yet set.
    pub const fn new() -> Global<T> {
        Global {
            state: AtomicU8::new(EMPTY),
            v: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Sets the value (once; a second call panics) and returns it.
    pub fn set(&self, v: T) -> &T {
        if self
            .state
            .compare_exchange(EMPTY, WRITING, Acquire, Relaxed)
            .is_err()
        {
            panic!("a kernel global set twice");
        }
        // SAFETY: the CAS made this call the only writer; no reader reads
        // before READY.
        unsafe { (*self.v.get()).write(v) };
        self.state.store(READY, Release);
        self.get()
    }

    /// The value, if it was set.
    pub fn try_get(&self) -> Option<&T> {
        // SAFETY: READY means written and never written again.
        (self.state.load(Acquire) == READY).then(|| unsafe { (*self.v.get()).assume_init_ref() })
    }

    /// The value.
    ///
    /// # Panics
    /// If it was not set yet (a bring-up order bug).
    #[inline]
    pub fn get(&self) -> &T {
        assert!(
            self.state.load(Acquire) == READY,
            "a kernel global used before it was set"
        );
        // SAFETY: READY means written and never written again.
        unsafe { (*self.v.get()).assume_init_ref() }
    }
}

/// Ends the run: QEMU exits with the status for `v`.
pub fn exit(v: u32) -> ! {
    x86::outl(EXIT_PORT, v);
    x86::halt()
}

/// Prints why the kernel stops, the allocators' state, and fails the run.
pub fn fail(why: core::fmt::Arguments<'_>) -> ! {
    use core::fmt::Write;
    let _ = writeln!(crate::serial::Raw, "\nkernel panic: {why}");
    tests::dump_state();
    let _ = writeln!(crate::serial::Raw, "0 passed, 1 failed");
    exit(EXIT_FAIL)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // One line: the message, then where (the runner quotes this line).
    match info.location() {
        Some(l) => fail(format_args!("{} (at {}:{})", info.message(), l.file(), l.line())),
        None => fail(format_args!("{}", info.message())),
    }
}

/// The boot command line (multiboot `-append`), copied before anything can
/// reuse low memory (the loader puts it beside the info structure there).
static CMDLINE: kmem_core::Lock<([u8; 256], usize)> = kmem_core::Lock::new(([0; 256], 0));

/// Copies the command line (at most 256 bytes) out of the loader's info.
fn save_cmdline(info: usize) {
    let mut c = CMDLINE.lock();
    // SAFETY: the loader's info structure is in low memory (identity
    // mapped, untouched so far); flags bit 2 says the cmdline field holds
    // the address of a NUL-terminated string.
    unsafe {
        if (info as *const u32).read_volatile() & 1 << 2 == 0 {
            return;
        }
        let p = ((info + 16) as *const u32).read_volatile() as usize as *const u8;
        let mut n = 0;
        while n < c.0.len() && p.add(n).read_volatile() != 0 {
            c.0[n] = p.add(n).read_volatile();
            n += 1;
        }
        c.1 = n;
    }
}

/// Whether the boot command line has the word `w`.
fn cmdline_has(w: &str) -> bool {
    let c = CMDLINE.lock();
    c.0[..c.1].split(|&b| b == b' ').any(|x| x == w.as_bytes())
}

/// CPUs running (the bootstrap CPU and the APs that arrived).
pub static CPUS_UP: AtomicUsize = AtomicUsize::new(1);

#[no_mangle]
extern "C" fn kmain(info: u32) -> ! {
    crate::serial::init();
    save_cmdline(info as usize);
    percpu::init_boot();
    trap::init_idt();
    trap::init_cpu(0);
    kprintln!("kmem-kernel: booted in long mode, multiboot info at {info:#x}");

    let mut apic_ids = [0u32; MAX_CPUS];
    let ncpus = apic::cpus_from_acpi(&mut apic_ids);
    kprintln!("kmem-kernel: APIC IDs {:?}", &apic_ids[..ncpus]);
    let topo = Topology::single(ncpus).unwrap_or_else(|e| panic!("topology: {e:?}"));
    let ram = mm::memory_map(info as usize);
    kprintln!(
        "kmem-kernel: {} CPUs in the ACPI MADT; {} MiB usable, kmem-pages gets {:#x}..{:#x}",
        ncpus,
        ram.usable >> 20,
        ram.start,
        ram.end
    );
    *tests::BOOT_FACTS.lock() = (ncpus, ram.usable);
    mm::init_frames(ram, &topo);
    mm::init_kernel_tables(ram, vmalloc::VMALLOC_START);
    kprintln!(
        "kmem-kernel: CR3 = {:#x} (page tables from kmem-quicklist)",
        x86::cr3()
    );
    percpu::init(mm::FRAMES.get(), &topo, &apic_ids[..ncpus]);
    vmalloc::init();
    kmalloc::init(ncpus);
    apic::disable_pic();
    apic::init_cpu();
    vmalloc::ONLINE[0].store(true, SeqCst);
    x86::sti();

    for (cpu, &id) in apic_ids.iter().enumerate().take(ncpus).skip(1) {
        let stack = mm::FRAMES
            .get()
            .alloc_pages_zeroed(16, 1)
            .unwrap_or_else(|e| panic!("AP stack: {e:?}"));
        let top = stack.as_ptr() as u64 + 16 * mm::PAGE as u64;
        if !apic::start_ap(id, cpu, top) {
            panic!("CPU {cpu} (APIC {id}) did not start");
        }
        CPUS_UP.fetch_add(1, SeqCst);
    }
    kprintln!("kmem-kernel: {} CPUs up", CPUS_UP.load(SeqCst));
    if cmdline_has(PANIC_WORD) {
        // The runner's test of the failure path: a panic with every
        // allocator up and every CPU running.
        panic!("requested by the command line ({PANIC_WORD})");
    }
    let failed = tests::run_all(CPUS_UP.load(SeqCst));
    exit(if failed == 0 { EXIT_PASS } else { EXIT_FAIL })
}

use kmem_core::PageSource as _;

#[no_mangle]
extern "C" fn ap_main() -> ! {
    let cpu = apic::STARTING.load(SeqCst);
    mm::enter_kernel_tables();
    percpu::enter(cpu);
    trap::init_cpu(cpu);
    apic::init_cpu();
    vmalloc::ONLINE[cpu].store(true, SeqCst);
    x86::sti();
    apic::ARRIVED.store(true, SeqCst);
    jobs::ap_loop(cpu)
}
