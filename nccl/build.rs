//! The shared library answers to NCCL's name: its SONAME is `libnccl.so.2`, so a program (or
//! another library) whose `DT_NEEDED` says `libnccl.so.2` is satisfied by it once it is loaded
//! (e.g. with `LD_PRELOAD`), and the copy `scripts/build-nccl.sh` installs under that name is
//! what the dynamic linker expects.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
