//! A counting global allocator: per-thread live and peak bytes, so a runner can check that one
//! decode allocates no more than its target's stated bound. Install it in a binary or test with
//! `#[global_allocator] static A: kamera_fuzz::CountingAlloc = kamera_fuzz::CountingAlloc;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts bytes on the allocating thread; otherwise the system allocator.
pub struct CountingAlloc;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static INSTALLED: Cell<bool> = const { Cell::new(false) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        let _ = INSTALLED.try_with(|i| i.set(true));
    });
}

// SAFETY: every call forwards to `System` with the same arguments; the counters are const
// thread-locals without destructors, so touching them never allocates or unwinds.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Runs `f` and returns its value with the peak bytes it held live on this thread above what
/// was live before; `None` for the peak when [`CountingAlloc`] is not the global allocator.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(|p| p.get());
    let installed = INSTALLED.with(|i| i.get());
    (out, installed.then(|| (peak - base).max(0) as usize))
}
