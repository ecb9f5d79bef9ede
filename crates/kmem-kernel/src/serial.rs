//! The console: COM1 at 115200 8N1, polled, one CPU at a time.

use core::fmt::{self, Write};

use kmem_core::Lock;

use crate::x86::{inb, outb};

const COM1: u16 = 0x3F8;

static CONSOLE: Lock<()> = Lock::new(());

/// Programs COM1.
pub fn init() {
    outb(COM1 + 1, 0x00); // no interrupts
    outb(COM1 + 3, 0x80); // divisor latch
    outb(COM1, 0x01); // 115200
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03); // 8N1
    outb(COM1 + 2, 0xC7); // FIFO on, cleared
    outb(COM1 + 4, 0x03); // DTR, RTS
}

fn put(b: u8) {
    while inb(COM1 + 5) & 0x20 == 0 {
        core::hint::spin_loop();
    }
    outb(COM1, b);
}

/// Writes raw bytes, without the console lock (the panic path).
pub struct Raw;

impl Write for Raw {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if b == b'\n' {
                put(b'\r');
            }
            put(b);
        }
        Ok(())
    }
}

/// Prints under the console lock (lines from several CPUs do not interleave).
pub fn print(args: fmt::Arguments<'_>) {
    let _g = CONSOLE.lock();
    let _ = Raw.write_fmt(args);
}

/// `print!` to the serial console.
#[macro_export]
macro_rules! kprint {
    ($($t:tt)*) => { $crate::serial::print(format_args!($($t)*)) };
}

/// `println!` to the serial console.
#[macro_export]
macro_rules! kprintln {
    () => { $crate::serial::print(format_args!("\n")) };
    ($($t:tt)*) => { $crate::serial::print(format_args!("{}\n", format_args!($($t)*))) };
}
