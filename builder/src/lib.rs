//! # mscclpp-build
//!
//! Compiles a `no_std` kernel crate to PTX with rustc's own `nvptx64-nvidia-cuda` target, from a
//! `build.rs`, so a host binary can embed its kernels with no CUDA toolkit, no nvcc and no
//! nightly toolchain. mscclpp's own `build.rs` builds `mscclpp-device` with it.
//!
//! ```no_run
//! // build.rs of a crate with kernels in ./kernels
//! fn main() {
//!     if let Err(e) = mscclpp_build::PtxBuilder::new("kernels").build() {
//!         e.exit();
//!     }
//! }
//! ```
//!
//! What it does: `cargo rustc --lib --crate-type cdylib --release --target nvptx64-nvidia-cuda
//! -Zbuild-std=core` on the kernel crate, in its own target directory under `OUT_DIR`, with
//! `RUSTC_BOOTSTRAP=1` set for that child build only (build-std and the PTX kernel ABI are
//! unstable features of the stable toolchain), and `-Ctarget-cpu=sm_XX` from the builder's arch,
//! else `MSCCLPP_CUDA_ARCH`, else `sm_90`. The PTX is copied to `OUT_DIR/<name>.ptx`, and cargo
//! is told to rebuild when the kernel crate (or any extra path) changes.
//!
//! Before building it checks that the toolchain has the components the nvptx build needs
//! (`rust-src`, `llvm-tools`, `llvm-bitcode-linker`); a missing one is one line naming it and
//! the command that installs it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Default GPU architecture (H100/H200).
pub const DEFAULT_ARCH: &str = "sm_90";
/// Environment variable that selects the architecture (`sm_80`, `sm_90`, …).
pub const ARCH_ENV: &str = "MSCCLPP_CUDA_ARCH";

/// Why a PTX build failed. [`BuildError::exit`] prints it the way cargo shows build-script
/// errors and exits.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// Not run from a build script (no `OUT_DIR`), or another variable cargo sets is missing.
    NotInBuildScript(&'static str),
    /// `MSCCLPP_CUDA_ARCH` (or the argument) is not of the form `sm_XX`.
    BadArch(String),
    /// `rustc --print sysroot` failed.
    Sysroot(String),
    /// A toolchain component the nvptx build needs is missing.
    MissingComponent {
        /// rustup's name of the component.
        component: &'static str,
    },
    /// The kernel crate has no Cargo.toml.
    NoKernelCrate(PathBuf),
    /// The child cargo could not be started.
    Spawn(std::io::Error),
    /// The kernel crate failed to compile; cargo's output was printed above.
    Compile {
        /// The kernel crate.
        crate_dir: PathBuf,
        /// Exit status of the child cargo.
        status: String,
    },
    /// The build succeeded but left no PTX where expected.
    NoPtx(PathBuf),
    /// Copying the PTX to `OUT_DIR` failed.
    Copy(PathBuf, std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInBuildScript(var) => {
                write!(f, "mscclpp-build must run inside a build.rs ({var} is not set)")
            }
            Self::BadArch(a) => write!(
                f,
                "GPU architecture {a:?} is not of the form sm_XX (set {ARCH_ENV}=sm_90, for example)"
            ),
            Self::Sysroot(e) => write!(f, "could not ask rustc for its sysroot: {e}"),
            Self::MissingComponent { component } => write!(
                f,
                "the Rust component `{component}` is missing (needed for the nvptx64 PTX build): run `rustup toolchain install` in the repository root (or `rustup component add {component}`)"
            ),
            Self::NoKernelCrate(p) => write!(f, "no kernel crate at {} (Cargo.toml missing)", p.display()),
            Self::Spawn(e) => write!(f, "could not start cargo for the PTX build: {e}"),
            Self::Compile { crate_dir, status } => write!(
                f,
                "the kernel crate {} failed to compile for nvptx64-nvidia-cuda ({status}); the compiler's messages are above",
                crate_dir.display()
            ),
            Self::NoPtx(p) => write!(f, "the PTX build produced no {}", p.display()),
            Self::Copy(p, e) => write!(f, "could not copy the PTX to {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for BuildError {}

impl BuildError {
    /// Prints the error as a single cargo build-script error line and exits with status 1.
    pub fn exit(&self) -> ! {
        println!("cargo::error={self}");
        eprintln!("error: {self}");
        std::process::exit(1)
    }
}

/// Builds one kernel crate to PTX.
#[derive(Clone, Debug)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: Option<String>,
    name: Option<String>,
    watch: Vec<PathBuf>,
}

impl PtxBuilder {
    /// A builder for the kernel crate at `crate_dir` (relative paths are relative to the
    /// calling package's manifest directory).
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        Self {
            crate_dir: crate_dir.as_ref().to_path_buf(),
            arch: None,
            name: None,
            watch: Vec::new(),
        }
    }

    /// Compile for `sm_XX` (overrides `MSCCLPP_CUDA_ARCH`).
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = Some(arch.into());
        self
    }

    /// Name of the output file `OUT_DIR/<name>.ptx` (default: the crate's library name).
    pub fn output_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Also rebuild when `path` changes (e.g. a shared-layout crate the kernels use).
    pub fn watch(mut self, path: impl AsRef<Path>) -> Self {
        self.watch.push(path.as_ref().to_path_buf());
        self
    }

    /// Builds; returns the path of the PTX file in `OUT_DIR`.
    pub fn build(self) -> Result<PathBuf, BuildError> {
        let out_dir = PathBuf::from(
            std::env::var_os("OUT_DIR").ok_or(BuildError::NotInBuildScript("OUT_DIR"))?,
        );
        let manifest_dir = PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR")
                .ok_or(BuildError::NotInBuildScript("CARGO_MANIFEST_DIR"))?,
        );
        let crate_dir = manifest_dir.join(&self.crate_dir);
        let manifest = crate_dir.join("Cargo.toml");
        if !manifest.is_file() {
            return Err(BuildError::NoKernelCrate(crate_dir));
        }
        println!("cargo::rerun-if-env-changed={ARCH_ENV}");
        println!("cargo::rerun-if-changed={}", crate_dir.display());
        for w in &self.watch {
            println!("cargo::rerun-if-changed={}", manifest_dir.join(w).display());
        }
        let arch = match self.arch {
            Some(a) => a,
            None => std::env::var(ARCH_ENV).unwrap_or_else(|_| DEFAULT_ARCH.to_string()),
        };
        if !valid_arch(&arch) {
            return Err(BuildError::BadArch(arch));
        }

        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        check_components(Path::new(&rustc))?;

        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target_dir = out_dir.join("ptx-target");
        let mut cmd = Command::new(cargo);
        // The parent build's settings must not leak into the nvptx build.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_MAKEFLAGS",
            "CARGO_PROFILE_RELEASE_DEBUG",
            "CARGO_PROFILE_RELEASE_LTO",
        ] {
            cmd.env_remove(var);
        }
        cmd.current_dir(&crate_dir)
            .env("RUSTC_BOOTSTRAP", "1")
            .args(["rustc", "--lib", "--crate-type", "cdylib", "--release", "--locked"])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", &format!("-Ctarget-cpu={arch}")]);
        let status = cmd.status().map_err(BuildError::Spawn)?;
        if !status.success() {
            return Err(BuildError::Compile {
                crate_dir,
                status: status.to_string(),
            });
        }
        let lib_name = match self.name {
            Some(n) => n,
            None => lib_name(&manifest),
        };
        let built = target_dir
            .join("nvptx64-nvidia-cuda/release")
            .join(format!("{}.ptx", lib_name.replace('-', "_")));
        if !built.is_file() {
            return Err(BuildError::NoPtx(built));
        }
        let dest = out_dir.join(format!("{}.ptx", lib_name.replace('-', "_")));
        std::fs::copy(&built, &dest).map_err(|e| BuildError::Copy(dest.clone(), e))?;
        Ok(dest)
    }
}

fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_").is_some_and(|n| {
        let digits = n.strip_suffix('a').unwrap_or(n);
        digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The package name from a Cargo.toml (the `[lib] name` is assumed to be the default).
fn lib_name(manifest: &Path) -> String {
    let text = std::fs::read_to_string(manifest).unwrap_or_default();
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some(v) = line.strip_prefix("name")
            && let Some(v) = v.trim_start().strip_prefix('=')
        {
            return v.trim().trim_matches('"').to_string();
        }
    }
    "kernels".to_string()
}

fn check_components(rustc: &Path) -> Result<(), BuildError> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| BuildError::Sysroot(e.to_string()))?;
    if !out.status.success() {
        return Err(BuildError::Sysroot(String::from_utf8_lossy(&out.stderr).into()));
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let host = std::env::var("HOST").unwrap_or_else(|_| "x86_64-unknown-linux-gnu".into());
    let host_bin = sysroot.join("lib/rustlib").join(&host).join("bin");
    let checks: [(&'static str, PathBuf); 3] = [
        (
            "rust-src",
            sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml"),
        ),
        (
            "llvm-bitcode-linker",
            host_bin.join("self-contained/llvm-bitcode-linker"),
        ),
        ("llvm-tools", host_bin.join("llc")),
    ];
    for (component, path) in checks {
        if !path.exists() {
            return Err(BuildError::MissingComponent { component });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        for ok in ["sm_90", "sm_80", "sm_100", "sm_90a"] {
            assert!(valid_arch(ok), "{ok}");
        }
        for bad in ["90", "sm_9", "compute_90", "sm_9x", "sm_"] {
            assert!(!valid_arch(bad), "{bad}");
        }
    }

    #[test]
    fn missing_component_message_names_the_fix() {
        let e = BuildError::MissingComponent {
            component: "rust-src",
        };
        let s = e.to_string();
        assert!(s.contains("`rust-src`") && s.contains("rustup toolchain install"), "{s}");
        assert_eq!(s.lines().count(), 1);
    }

    #[test]
    fn lib_name_reads_package_name() {
        let dir = std::env::temp_dir().join(format!("mscclpp-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = dir.join("Cargo.toml");
        std::fs::write(&m, "[workspace]\n[package]\nname = \"my-kernels\"\nversion = \"0.1.0\"\n")
            .unwrap();
        assert_eq!(lib_name(&m), "my-kernels");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
