//! The poison-tolerant lock this crate uses: the workspace's one helper,
//! [`mscclpp::host::sync::lock`] (a panic of another call was already reported as an internal
//! error; the data under these locks stays consistent at every point a call can panic).

pub use mscclpp::host::sync::lock;
