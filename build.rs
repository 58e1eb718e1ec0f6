//! Builds `device/` (mscclpp-device) for nvptx64 and embeds the PTX as `mscclpp::DEVICE_PTX`.
//! The device crate's layouts come from `shared/`, so changes there rebuild the PTX too.
//!
//! `MSCCLPP_SKIP_PTX=1` skips the nvptx build and embeds an empty PTX instead: for CPU-backend
//! runs that rebuild the device crate many times (`scripts/mutants.sh`), where the PTX is never
//! loaded. Loading that empty PTX on the CUDA backend fails with `Error::ModuleLoad`, whose
//! cause names this variable.

use std::path::PathBuf;

/// Set to `1` to embed an empty PTX instead of building the device crate for nvptx64.
const SKIP_ENV: &str = "MSCCLPP_SKIP_PTX";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed={SKIP_ENV}");
    if std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1") {
        let Some(out_dir) = std::env::var_os("OUT_DIR") else {
            mscclpp_build::BuildError::NotInBuildScript("OUT_DIR").exit()
        };
        // Another name than the real PTX's, so `scripts/check-ptx.sh` never picks it up.
        let ptx = PathBuf::from(out_dir).join("mscclpp_device_skipped.ptx");
        if let Err(e) = std::fs::write(&ptx, "") {
            mscclpp_build::BuildError::Copy(ptx, e).exit()
        }
        println!(
            "cargo::warning={SKIP_ENV}=1: the device PTX is not built; DEVICE_PTX is empty \
             (CPU backend only)"
        );
        println!("cargo::rustc-env=MSCCLPP_DEVICE_PTX_PATH={}", ptx.display());
        return;
    }
    match mscclpp_build::PtxBuilder::new("device")
        .watch("shared/src")
        .build()
    {
        Ok(ptx) => println!("cargo::rustc-env=MSCCLPP_DEVICE_PTX_PATH={}", ptx.display()),
        Err(e) => e.exit(),
    }
}
