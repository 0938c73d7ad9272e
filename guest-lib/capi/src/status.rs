//! Results: every call returns 0 or a count on success and `-errno` on
//! failure; the text of the last failure is kept per thread.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use ulnic::Error;

/// The version of this API: the soname is `libulnic.so.ULNIC_API_MAJOR`.
pub const ULNIC_API_MAJOR: u32 = 0;
/// Minor version: grows when calls are added.
pub const ULNIC_API_MINOR: u32 = 7;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub(crate) fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Runs `f`, turning its error (or a panic) into `-errno` and the last
/// error's text: nothing unwinds into C.
pub(crate) fn guard(what: &str, f: impl FnOnce() -> Result<i32, Error>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last(&format!("{what}: {e}"));
            -e.errno()
        }
        Err(_) => {
            set_last(&format!("{what}: internal error (a bug in libulnic)"));
            -libc::EIO
        }
    }
}

/// A NULL or otherwise unusable argument: `-EINVAL` with `why`.
pub(crate) fn invalid(what: &str, why: &str) -> i32 {
    set_last(&format!("{what}: {why}"));
    -libc::EINVAL
}

/// A reference to the object behind a handle, or an early `-EINVAL`.
macro_rules! handle {
    ($p:expr, $what:expr) => {
        // SAFETY: the caller passes a handle this library made and has
        // not freed, used by one thread at a time (the header says so).
        match unsafe { $p.as_mut() } {
            Some(h) => h,
            None => {
                return $crate::status::invalid($what, concat!(stringify!($p), " is NULL")).into()
            }
        }
    };
}
pub(crate) use handle;

/// The text of this thread's last failed call (empty if none failed): what
/// failed and why, for a message to a person. Valid until this thread's
/// next failing call.
///
/// ```c
/// int err = ulnic_open(&nic);
/// if (err < 0)
///     fprintf(stderr, "%s (%s)\n", ulnic_last_error(), strerror(-err));
/// ```
#[no_mangle]
pub extern "C" fn ulnic_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// The library's version, as `major << 16 | minor`; a program built
/// against this header may check `ulnic_version() >> 16 ==
/// ULNIC_API_MAJOR`.
///
/// ```c
/// printf("libulnic %u.%u\n", ulnic_version() >> 16, ulnic_version() & 0xffff);
/// ```
#[no_mangle]
pub extern "C" fn ulnic_version() -> u32 {
    ULNIC_API_MAJOR << 16 | ULNIC_API_MINOR
}
