//! Compiles ../kernels (crate `my-kernels`) to PTX: OUT_DIR/my_kernels.ptx, which
//! src/main.rs embeds with `mscclpp::include_ptx!("my_kernels")`.

fn main() {
    if let Err(e) = mscclpp_build::PtxBuilder::new("../kernels").build() {
        e.exit();
    }
}
