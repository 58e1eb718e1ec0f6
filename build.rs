//! Builds `device/` (mscclpp-device) for nvptx64 and embeds the PTX as `mscclpp::DEVICE_PTX`.
//! The device crate's layouts come from `shared/`, so changes there rebuild the PTX too.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    match mscclpp_build::PtxBuilder::new("device")
        .watch("shared/src")
        .build()
    {
        Ok(ptx) => println!("cargo::rustc-env=MSCCLPP_DEVICE_PTX_PATH={}", ptx.display()),
        Err(e) => e.exit(),
    }
}
