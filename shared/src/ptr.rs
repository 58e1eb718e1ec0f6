//! `DevicePtr<T>`: a device virtual address carried inside shared layouts.
//!
//! Layouts that cross host↔device hold addresses, never Rust references: a raw pointer is not
//! `Pod`, and the address is only meaningful in the address space of the GPU (or, on the CPU
//! backend, of the process that mapped it). `DevicePtr<T>` is a `u64` with a type tag so that
//! a handle's fields say what they point at, and so the C header can mirror it as `uint64_t`.

use core::fmt;
use core::marker::PhantomData;

/// A typed device address (`uint64_t` in C). Zero is the null address.
#[repr(transparent)]
pub struct DevicePtr<T> {
    addr: u64,
    _to: PhantomData<*mut T>,
}

impl<T> DevicePtr<T> {
    /// The null address.
    pub const NULL: Self = Self::from_addr(0);

    /// Wraps a raw device address.
    pub const fn from_addr(addr: u64) -> Self {
        Self {
            addr,
            _to: PhantomData,
        }
    }

    /// Wraps a pointer of the current address space (device code, or the CPU backend).
    pub fn from_ptr(ptr: *mut T) -> Self {
        Self::from_addr(ptr as usize as u64)
    }

    /// The raw address.
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// Whether this is the null address.
    pub const fn is_null(self) -> bool {
        self.addr == 0
    }

    /// The address as a pointer of the current address space. Only device code (or the CPU
    /// backend, where device addresses are host addresses) may dereference it.
    pub const fn as_ptr(self) -> *mut T {
        self.addr as usize as *mut T
    }

    /// The address `count` elements of `T` further on (wrapping, like `pointer::wrapping_add`).
    pub const fn wrapping_add(self, count: u64) -> Self {
        Self::from_addr(
            self.addr
                .wrapping_add(count.wrapping_mul(core::mem::size_of::<T>() as u64)),
        )
    }

    /// The address `bytes` further on, with another element type.
    pub const fn byte_add_cast<U>(self, bytes: u64) -> DevicePtr<U> {
        DevicePtr::from_addr(self.addr.wrapping_add(bytes))
    }

    /// The same address with another element type.
    pub const fn cast<U>(self) -> DevicePtr<U> {
        DevicePtr::from_addr(self.addr)
    }
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}
impl<T> PartialEq for DevicePtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr
    }
}
impl<T> Eq for DevicePtr<T> {}
impl<T> Default for DevicePtr<T> {
    fn default() -> Self {
        Self::NULL
    }
}
impl<T> fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x})", self.addr)
    }
}

// SAFETY: `DevicePtr<T>` is `repr(transparent)` over a `u64` (the `PhantomData` is zero-sized):
// every bit pattern is valid and all-zeroes is the null address.
unsafe impl<T: 'static> bytemuck::Zeroable for DevicePtr<T> {}
// SAFETY: as above; no padding, no interior references, `Copy` for every `T`.
unsafe impl<T: 'static> bytemuck::Pod for DevicePtr<T> {}
// SAFETY: a `DevicePtr` is an integer; it is only dereferenced by device code under the
// contracts of the handle that holds it, so sending the integer between threads is harmless.
unsafe impl<T> Send for DevicePtr<T> {}
// SAFETY: as for `Send`: shared references to an integer.
unsafe impl<T> Sync for DevicePtr<T> {}

static_assertions::assert_eq_size!(DevicePtr<u8>, u64);
static_assertions::assert_eq_align!(DevicePtr<u8>, u64);
