//! The loader of the network transports' libraries (libfabric, libibverbs): `dlopen` at run
//! time, so a build needs neither, and a machine without one gets a typed "not available"
//! error instead of a failure to start. A library is opened once per process and never
//! closed: the function pointers taken from it stay valid for the whole process.

use std::ffi::{CStr, CString, c_void};

/// An opened shared object (never closed).
pub(crate) struct Library {
    handle: *mut c_void,
    /// The name it was opened by.
    name: String,
}

// SAFETY: the handle is only passed to `dlsym`, which is thread-safe; it is never closed.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// The last `dlerror()` message of this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Library {
    /// Opens `name` (a file name the dynamic loader searches for, or a path), resolving every
    /// symbol now; the error says why it could not be loaded.
    pub(crate) fn open(name: &str) -> Result<Self, String> {
        let c = CString::new(name).map_err(|e| format!("{name:?}: {e}"))?;
        // SAFETY: a valid NUL-terminated name; RTLD_NOW resolves every symbol now. The handle
        // is never closed (module docs).
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!("{name} could not be loaded: {}", dl_error()));
        }
        Ok(Self {
            handle,
            name: name.to_owned(),
        })
    }

    /// The name it was opened by.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The exported function `symbol` as the function pointer type `F`; the error says which
    /// symbol is missing.
    ///
    /// # Safety
    /// `F` is an `unsafe extern "C" fn` pointer type whose signature is the C signature of
    /// `symbol` in this library.
    pub(crate) unsafe fn function<F: Copy>(&self, symbol: &str) -> Result<F, String> {
        const {
            assert!(size_of::<F>() == size_of::<*mut c_void>());
        }
        let c = CString::new(symbol).map_err(|e| format!("{symbol:?}: {e}"))?;
        // SAFETY: `handle` is a live handle from dlopen (never closed); `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(format!(
                "{} has no symbol {symbol}: {}",
                self.name,
                dl_error()
            ));
        }
        // SAFETY: `p` is the non-null address of `symbol`, a function whose signature is `F`
        // (the caller's contract); `F` is pointer-sized (checked above).
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_or_symbol_says_which() {
        let e = Library::open("libmscclpp-no-such-library.so.7")
            .err()
            .unwrap();
        assert!(
            e.starts_with("libmscclpp-no-such-library.so.7 could not be loaded: "),
            "{e}"
        );
        assert!(Library::open("bad\0name").is_err());
        // The C library is always there.
        let libc = Library::open("libc.so.6").unwrap();
        assert_eq!(libc.name(), "libc.so.6");
        type Strlen = unsafe extern "C" fn(*const std::ffi::c_char) -> usize;
        // SAFETY: `strlen`'s C signature is `Strlen`.
        let strlen = unsafe { libc.function::<Strlen>("strlen") }.unwrap();
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { strlen(c"four".as_ptr()) }, 4);
        // SAFETY: never called.
        let missing = unsafe { libc.function::<Strlen>("mscclpp_no_such_symbol") };
        let e = missing.err().unwrap();
        assert!(
            e.starts_with("libc.so.6 has no symbol mscclpp_no_such_symbol"),
            "{e}"
        );
    }
}
