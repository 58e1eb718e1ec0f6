//! How the built-in kernels are launched, for every unit that launches them: the LL16 launch
//! shape and keeper block (`ll`), the staged kernel in pieces (`staged`), the direct kernel and
//! its barriers (`direct`), the port kernel's exchanges (`port`). They sit below the units, so
//! a unit that shares a kernel with another (`ll2` the LL16 shape, `put` the staged kernel,
//! `ce` the direct kernel's barriers, `hier` the port exchange) imports this layer, never its
//! sibling.

pub(crate) mod direct;
pub(crate) mod ll;
pub(crate) mod port;
pub(crate) mod staged;
