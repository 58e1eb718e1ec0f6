//! The safe, typed form of the collectives, for Rust programs: buffers of a Rust element type
//! ([`DeviceVec<T>`]), whose [`DataType`] comes from `T` through a sealed trait ([`Element`]),
//! lengths checked before anything is queued ([`Error::LengthMismatch`]), and no raw pointer
//! anywhere. The raw, `unsafe` calls of [`Collectives`] stay for memory from other allocators
//! (PyTorch's, cudarc's, a C caller's).
//!
//! # Why these calls are safe
//!
//! A [`DeviceVec`] owns its memory, so it is live while borrowed; what remains is queued work
//! that outlives the borrow. Every typed call makes its stream wait for the vectors' earlier
//! uses and records each vector's event after the queued work, and a vector waits for that
//! event before it frees its memory (`Drop`) and before the host reads or writes it. Dropping
//! a vector still in use therefore waits (device waits are bounded by the spin limit), and
//! forgetting one (`mem::forget`) only leaks it. A scalar of a pre-multiplied sum in device
//! memory ([`Scalar::Device`]) is a raw pointer: the typed calls refuse
//! it.
//!
//! | CUDA | here |
//! |---|---|
//! | `float*` from `cudaMalloc` | `DeviceVec<f32>` ([`DeviceVec::zeroed`], [`DeviceVec::from_host`]) |
//! | `__half`, `__nv_bfloat16`, `__nv_fp8_e4m3`, `__nv_fp8_e5m2` | [`F16`], [`Bf16`], [`F8E4M3`], [`F8E5M2`] (their bits) |
//! | `ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream)` | `c.all_reduce_vec(&send, &mut recv, Reduction::Sum, &stream)` |

use std::marker::PhantomData;

use mscclpp_host::gpu::{DeviceBuffer, Event, Gpu, Stream};
use mscclpp_host::{Error, Result};
use mscclpp_shared::{DataType, DevicePtr};

use super::api::Collectives;
use super::call::Call;
use super::reduction::{Reduction, Scalar};

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is one of NCCL's element types: its [`DataType`] is `Self::DTYPE`.
/// Sealed: the library's types only.
pub trait Element: sealed::Sealed + bytemuck::Pod + Send + Sync + 'static {
    /// The element type the kernels see.
    const DTYPE: DataType;
}

macro_rules! elements {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

macro_rules! bits {
    ($($(#[doc = $doc:literal])* $name:ident($bits:ty)),* $(,)?) => {$(
        $(#[doc = $doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name(pub $bits);
    )*};
}

bits! {
    /// An IEEE half (its bits): `DataType::F16`.
    F16(u16),
    /// A bfloat16 (its bits): `DataType::BF16`.
    Bf16(u16),
    /// An 8-bit float with 4 exponent and 3 mantissa bits (its bits): `DataType::F8E4M3`.
    F8E4M3(u8),
    /// An 8-bit float with 5 exponent and 2 mantissa bits (its bits): `DataType::F8E5M2`.
    F8E5M2(u8),
}

elements! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f32 => F32, f64 => F64, F16 => F16, Bf16 => BF16, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
}

/// `len` elements of `T` in device memory that this process allocated and owns (module
/// docs: its queued uses are waited for before it is freed or touched by the host).
pub struct DeviceVec<T: Element> {
    buf: DeviceBuffer,
    len: usize,
    /// Recorded after every typed call that uses the vector.
    uses: Event,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceVec<{:?}>({} on {:?})",
            T::DTYPE,
            self.len,
            self.buf.gpu()
        )
    }
}

impl<T: Element> DeviceVec<T> {
    /// `len` zeroed elements on `gpu`.
    pub fn zeroed(gpu: &Gpu, len: usize) -> Result<Self> {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        Ok(Self {
            buf: gpu.alloc(bytes)?,
            len,
            uses: gpu.event()?,
            _t: PhantomData,
        })
    }

    /// A copy of `data` on `gpu`.
    pub fn from_host(gpu: &Gpu, data: &[T]) -> Result<Self> {
        let mut v = Self::zeroed(gpu, data.len())?;
        v.copy_from_host(data)?;
        Ok(v)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it lives on.
    pub fn gpu(&self) -> &Gpu {
        self.buf.gpu()
    }

    /// Its first element's device address (for the raw calls and kernels of one's own; the
    /// address is valid while the vector lives).
    pub fn ptr(&self) -> DevicePtr<T> {
        self.buf.ptr().cast()
    }

    /// Overwrites it with `data` (the same length, else [`Error::LengthMismatch`]), after its
    /// queued uses.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        check_len("copy_from_host", data.len(), self.len)?;
        self.uses.synchronize()?;
        self.buf.copy_from_host(0, bytemuck::cast_slice(data))
    }

    /// Its elements, after its queued uses.
    pub fn to_host(&self) -> Result<Vec<T>> {
        self.uses.synchronize()?;
        let mut out = vec![T::zeroed(); self.len];
        self.buf
            .copy_to_host(0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Orders `stream` after this vector's earlier uses (before a call is queued).
    fn enter(&self, stream: &Stream) -> Result<()> {
        stream.wait_event(&self.uses)
    }

    /// Marks the work queued on `stream` so far as a use of this vector.
    fn leave(&self, stream: &Stream) -> Result<()> {
        stream.record(&self.uses)
    }
}

impl<T: Element> Drop for DeviceVec<T> {
    fn drop(&mut self) {
        if let Err(e) = self.uses.synchronize() {
            tracing::warn!(error = %e, "a device vector's last use failed; freeing it anyway");
        }
    }
}

fn check_len(what: &'static str, got: usize, need: usize) -> Result<()> {
    if got == need {
        Ok(())
    } else {
        Err(Error::LengthMismatch { what, got, need })
    }
}

/// Refuses a device scalar (a raw pointer) in a typed call.
fn host_op(op: Reduction, c: &Collectives) -> Result<Reduction> {
    match op {
        Reduction::PreMulSum(Scalar::Device(_)) => Err(Error::Unsupported {
            what: "a device-memory scalar in a typed call (use Scalar::Host, or the raw call)",
            backend: c.communicator().gpu().kind(),
        }),
        op => Ok(op),
    }
}

/// Refuses a vector of another device than the communicator's.
fn same_device<T: Element>(c: &Collectives, v: &DeviceVec<T>) -> Result<()> {
    let (g, mine) = (v.gpu(), c.communicator().gpu());
    if g.kind() == mine.kind() && g.ordinal() == mine.ordinal() {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: "a device vector of another device than the communicator's",
            backend: mine.kind(),
        })
    }
}

impl Collectives {
    /// Queues `call` on `stream` for `vecs` (checked to live on this device, their lengths
    /// checked by the caller for the call), ordered after their earlier uses and marked as a
    /// use of each (module docs).
    fn typed<T: Element>(
        &self,
        stream: &Stream,
        vecs: &[&DeviceVec<T>],
        call: &Call,
    ) -> Result<()> {
        for v in vecs {
            same_device(self, v)?;
            v.enter(stream)?;
        }
        // SAFETY: every buffer of `call` is one of `vecs`, which hold what the call moves (the
        // callers check the lengths) and stay alive until the queued work completes (module
        // docs); the operator carries no pointer (`host_op`).
        let queued = unsafe { self.queue(call, stream, None) };
        for v in vecs {
            v.leave(stream)?;
        }
        queued
    }

    /// All-reduce of `input` into `output` (the same length) by `op`.
    pub fn all_reduce_vec<T: Element>(
        &self,
        input: &DeviceVec<T>,
        output: &mut DeviceVec<T>,
        op: impl Into<Reduction>,
        stream: &Stream,
    ) -> Result<()> {
        check_len("all_reduce output", output.len, input.len)?;
        let call = Call::AllReduce {
            input: input.buf.ptr(),
            output: output.buf.ptr(),
            count: input.len,
            dtype: T::DTYPE,
            op: host_op(op.into(), self)?,
        };
        self.typed(stream, &[input, output], &call)
    }

    /// All-reduce of `buf` in place by `op`.
    pub fn all_reduce_vec_in_place<T: Element>(
        &self,
        buf: &mut DeviceVec<T>,
        op: impl Into<Reduction>,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::AllReduce {
            input: buf.buf.ptr(),
            output: buf.buf.ptr(),
            count: buf.len,
            dtype: T::DTYPE,
            op: host_op(op.into(), self)?,
        };
        self.typed(stream, &[buf], &call)
    }

    /// All-gather: every rank's `input` lands at `output[rank * input.len()..]` on every rank
    /// (`output` holds `nranks` times `input`).
    pub fn all_gather_vec<T: Element>(
        &self,
        input: &DeviceVec<T>,
        output: &mut DeviceVec<T>,
        stream: &Stream,
    ) -> Result<()> {
        let n = self.communicator().size();
        check_len("all_gather output", output.len, n * input.len)?;
        let call = Call::AllGather {
            input: input.buf.ptr(),
            output: output.buf.ptr(),
            count: input.len,
            dtype: T::DTYPE,
        };
        self.typed(stream, &[input, output], &call)
    }

    /// Reduce-scatter: rank r gets the reduction by `op` of part r of every rank's `input`
    /// (`input` holds `nranks` times `output`).
    pub fn reduce_scatter_vec<T: Element>(
        &self,
        input: &DeviceVec<T>,
        output: &mut DeviceVec<T>,
        op: impl Into<Reduction>,
        stream: &Stream,
    ) -> Result<()> {
        let n = self.communicator().size();
        check_len("reduce_scatter input", input.len, n * output.len)?;
        let call = Call::ReduceScatter {
            input: input.buf.ptr(),
            output: output.buf.ptr(),
            count: output.len,
            dtype: T::DTYPE,
            op: host_op(op.into(), self)?,
        };
        self.typed(stream, &[input, output], &call)
    }

    /// Broadcast of `root`'s `buf` into every rank's `buf` (in place).
    pub fn broadcast_vec<T: Element>(
        &self,
        buf: &mut DeviceVec<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::Broadcast {
            input: buf.buf.ptr(),
            output: buf.buf.ptr(),
            count: buf.len,
            dtype: T::DTYPE,
            root,
        };
        self.typed(stream, &[buf], &call)
    }

    /// All-to-all: part p of every rank's `input` lands as part r of rank p's `output` (both
    /// hold `nranks` parts of the same length).
    pub fn all_to_all_vec<T: Element>(
        &self,
        input: &DeviceVec<T>,
        output: &mut DeviceVec<T>,
        stream: &Stream,
    ) -> Result<()> {
        let n = self.communicator().size();
        check_len("all_to_all output", output.len, input.len)?;
        let part = input.len / n;
        check_len("all_to_all input (whole parts)", input.len, n * part)?;
        let call = Call::AllToAll {
            input: input.buf.ptr(),
            output: output.buf.ptr(),
            count: part,
            dtype: T::DTYPE,
        };
        self.typed(stream, &[input, output], &call)
    }

    /// Sends `input` to `peer`, which calls [`recv_vec`](Self::recv_vec) with as many elements.
    pub fn send_vec<T: Element>(
        &self,
        input: &DeviceVec<T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::Send {
            input: input.buf.ptr(),
            count: input.len,
            dtype: T::DTYPE,
            peer,
        };
        self.typed(stream, &[input], &call)
    }

    /// Receives `output.len()` elements from `peer` into `output`.
    pub fn recv_vec<T: Element>(
        &self,
        output: &mut DeviceVec<T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::Recv {
            output: output.buf.ptr(),
            count: output.len,
            dtype: T::DTYPE,
            peer,
        };
        self.typed(stream, &[output], &call)
    }
}
