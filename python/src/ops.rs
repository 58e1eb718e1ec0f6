//! [`Op`]: one collective or point-to-point call, described once, queued alone
//! ([`Op::queue`]) or recorded into a group ([`Op::record`]). Its constructors check what can be
//! checked without the communicator (element type, reduction, algorithm names); the library
//! checks the rest when the call is queued (ranks, peers, counts against the world's size).
//!
//! Buffers are device addresses as integers. The Python package takes them from live array
//! objects after checking their sizes against the call (`mscclpp_rs/collectives.py`), and keeps
//! the arrays referenced until the call returns (for calls on the communicator's own stream,
//! until the work is done); the addresses are trusted as the library's `unsafe` calls trust
//! theirs. This module is not part of the public API.

use mscclpp::collectives::{Algorithm, Collectives, Group, Reduction};
use mscclpp::host::Result;
use mscclpp::host::gpu::Stream;
use mscclpp::shared::{DataType, DevicePtr};
use pyo3::prelude::*;

use crate::args;

/// One call (module docs).
#[derive(Clone, Debug)]
enum Kind {
    AllReduce(Reduction, Option<Algorithm>),
    AllGather(Option<Algorithm>),
    ReduceScatter(Reduction, Option<Algorithm>),
    Broadcast(usize, Option<Algorithm>),
    Reduce(Reduction, usize, Option<Algorithm>),
    AllToAll(Option<Algorithm>),
    Gather(usize),
    Scatter(usize),
    AllToAllv {
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
    },
    Send(usize),
    Recv(usize),
}

/// A call with its buffers, count and element type.
#[pyclass(frozen, module = "mscclpp_rs._native")]
#[derive(Clone, Debug)]
pub struct Op {
    kind: Kind,
    input: DevicePtr<u8>,
    output: DevicePtr<u8>,
    count: usize,
    dtype: DataType,
}

fn ptr(addr: u64) -> DevicePtr<u8> {
    DevicePtr::from_addr(addr)
}

impl Op {
    fn new(kind: Kind, input: u64, output: u64, count: usize, dtype: u32) -> PyResult<Self> {
        Ok(Self {
            kind,
            input: ptr(input),
            output: ptr(output),
            count,
            dtype: args::dtype(dtype)?,
        })
    }

    /// A reducing call's operator (module `args`), for `dtype`.
    fn reduction(
        name: &str,
        scalar: Option<f64>,
        scalar_ptr: Option<u64>,
        dtype: u32,
    ) -> PyResult<Reduction> {
        args::reduction(name, scalar, scalar_ptr, args::dtype(dtype)?)
    }

    /// Queues the call alone on `stream`.
    ///
    /// # Safety
    /// The buffers are live device memory of the sizes the call names until the queued work
    /// completes (module docs), as the library's call of the same name requires.
    pub unsafe fn queue(&self, c: &Collectives, stream: &Stream) -> Result<()> {
        let (i, o, n, t) = (self.input, self.output, self.count, self.dtype);
        // SAFETY (every arm): the caller's contract, which is the library call's.
        unsafe {
            match &self.kind {
                Kind::AllReduce(op, a) => c.all_reduce(i, o, n, t, *op, stream, *a),
                Kind::AllGather(a) => c.all_gather(i, o, n, t, stream, *a),
                Kind::ReduceScatter(op, a) => c.reduce_scatter(i, o, n, t, *op, stream, *a),
                Kind::Broadcast(root, a) => c.broadcast(i, o, n, t, *root, stream, *a),
                Kind::Reduce(op, root, a) => c.reduce(i, o, n, t, *op, *root, stream, *a),
                Kind::AllToAll(a) => c.all_to_all(i, o, n, t, stream, *a),
                Kind::Gather(root) => c.gather(i, o, n, t, *root, stream),
                Kind::Scatter(root) => c.scatter(i, o, n, t, *root, stream),
                Kind::AllToAllv {
                    send_counts,
                    send_displs,
                    recv_counts,
                    recv_displs,
                } => c.all_to_allv(
                    i,
                    send_counts,
                    send_displs,
                    o,
                    recv_counts,
                    recv_displs,
                    t,
                    stream,
                ),
                Kind::Send(peer) => c.send(i, n, t, *peer, stream),
                Kind::Recv(peer) => c.recv(o, n, t, *peer, stream),
            }
        }
    }

    /// Records the call into `g`.
    ///
    /// # Safety
    /// As [`queue`](Self::queue), until the work the group's `end` queues completes.
    pub unsafe fn record(&self, g: &mut Group<'_>) -> Result<()> {
        let (i, o, n, t) = (self.input, self.output, self.count, self.dtype);
        // SAFETY (every arm): the caller's contract, which is the group method's.
        unsafe {
            match &self.kind {
                Kind::AllReduce(op, a) => g.all_reduce(i, o, n, t, *op, *a),
                Kind::AllGather(a) => g.all_gather(i, o, n, t, *a),
                Kind::ReduceScatter(op, a) => g.reduce_scatter(i, o, n, t, *op, *a),
                Kind::Broadcast(root, a) => g.broadcast(i, o, n, t, *root, *a),
                Kind::Reduce(op, root, a) => g.reduce(i, o, n, t, *op, *root, *a),
                Kind::AllToAll(a) => g.all_to_all(i, o, n, t, *a),
                Kind::Gather(root) => g.gather(i, o, n, t, *root),
                Kind::Scatter(root) => g.scatter(i, o, n, t, *root),
                Kind::AllToAllv {
                    send_counts,
                    send_displs,
                    recv_counts,
                    recv_displs,
                } => g.all_to_allv(i, send_counts, send_displs, o, recv_counts, recv_displs, t),
                Kind::Send(peer) => g.send(i, n, t, *peer),
                Kind::Recv(peer) => g.recv(o, n, t, *peer),
            }
        }
    }
}

#[pymethods]
impl Op {
    /// All-reduce of `count` elements from `input` into `output` (the same address: in
    /// place) by `op`.
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, op, scalar=None, scalar_ptr=None, algorithm=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        op: &str,
        scalar: Option<f64>,
        scalar_ptr: Option<u64>,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let r = Self::reduction(op, scalar, scalar_ptr, dtype)?;
        let kind = Kind::AllReduce(r, args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// All-gather: every rank's `count` elements land at `output[rank * count ..]`.
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, algorithm=None))]
    fn all_gather(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let kind = Kind::AllGather(args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// Reduce-scatter: rank r gets the reduction of every rank's part r (`count` elements).
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, op, scalar=None, scalar_ptr=None, algorithm=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        op: &str,
        scalar: Option<f64>,
        scalar_ptr: Option<u64>,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let r = Self::reduction(op, scalar, scalar_ptr, dtype)?;
        let kind = Kind::ReduceScatter(r, args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// Broadcast of `root`'s `count` elements into every rank's `output`.
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, root, algorithm=None))]
    fn broadcast(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        root: usize,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let kind = Kind::Broadcast(root, args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// Reduce of every rank's `count` elements into `root`'s `output`.
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, op, root, scalar=None, scalar_ptr=None, algorithm=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        op: &str,
        root: usize,
        scalar: Option<f64>,
        scalar_ptr: Option<u64>,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let r = Self::reduction(op, scalar, scalar_ptr, dtype)?;
        let kind = Kind::Reduce(r, root, args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// All-to-all: part p (`count` elements) of every rank's input lands as part r of rank p's
    /// output.
    #[staticmethod]
    #[pyo3(signature = (input, output, count, dtype, algorithm=None))]
    fn all_to_all(
        input: u64,
        output: u64,
        count: usize,
        dtype: u32,
        algorithm: Option<&str>,
    ) -> PyResult<Self> {
        let kind = Kind::AllToAll(args::algorithm(algorithm)?);
        Self::new(kind, input, output, count, dtype)
    }

    /// Gather of every rank's `count` elements into `root`'s `output`.
    #[staticmethod]
    fn gather(input: u64, output: u64, count: usize, dtype: u32, root: usize) -> PyResult<Self> {
        Self::new(Kind::Gather(root), input, output, count, dtype)
    }

    /// Scatter of `root`'s parts of `count` elements into every rank's `output`.
    #[staticmethod]
    fn scatter(input: u64, output: u64, count: usize, dtype: u32, root: usize) -> PyResult<Self> {
        Self::new(Kind::Scatter(root), input, output, count, dtype)
    }

    /// All-to-all with a count and a displacement (in elements) per rank.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn all_to_allv(
        input: u64,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        output: u64,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
        dtype: u32,
    ) -> PyResult<Self> {
        let kind = Kind::AllToAllv {
            send_counts,
            send_displs,
            recv_counts,
            recv_displs,
        };
        Self::new(kind, input, output, 0, dtype)
    }

    /// A send of `count` elements to `peer`.
    #[staticmethod]
    fn send(input: u64, count: usize, dtype: u32, peer: usize) -> PyResult<Self> {
        Self::new(Kind::Send(peer), input, 0, count, dtype)
    }

    /// A receive of `count` elements from `peer`.
    #[staticmethod]
    fn recv(output: u64, count: usize, dtype: u32, peer: usize) -> PyResult<Self> {
        Self::new(Kind::Recv(peer), 0, output, count, dtype)
    }

    fn __repr__(&self) -> String {
        format!(
            "Op({:?}, {} x {:?}, input {:#x}, output {:#x})",
            self.kind,
            self.count,
            self.dtype,
            self.input.addr(),
            self.output.addr()
        )
    }
}
