//! # mscclpp-build
//!
//! Compiles a `no_std` kernel crate to PTX with rustc's own `nvptx64-nvidia-cuda` target, from a
//! `build.rs`, so a host binary can embed its kernels with no CUDA toolkit, no nvcc and no
//! nightly toolchain. mscclpp's own `build.rs` builds `mscclpp-device` with it.
//!
//! ```no_run
//! // build.rs of a host crate whose kernels are the crate `my-kernels` in ../kernels
//! fn main() {
//!     if let Err(e) = mscclpp_build::PtxBuilder::new("../kernels").build() {
//!         e.exit(); // one `error:` line: what failed, and the fix
//!     }
//! }
//! // src/main.rs then embeds OUT_DIR/my_kernels.ptx:
//! //     const MY_KERNELS_PTX: &str = mscclpp::include_ptx!("my_kernels");
//! ```
//!
//! What it does: `cargo rustc --lib --crate-type cdylib --release --target nvptx64-nvidia-cuda
//! -Zbuild-std=core` on the kernel crate, in its own target directory under `OUT_DIR`, with
//! `RUSTC_BOOTSTRAP=1` set for that child build only (build-std and the PTX kernel ABI are
//! unstable features of the stable toolchain), and `-Ctarget-cpu=sm_XX` from the builder's arch,
//! else `MSCCLPP_CUDA_ARCH`, else `sm_90`. The PTX is copied to `OUT_DIR/<name>.ptx`, where
//! `<name>` is the kernel crate's library name (`my_kernels` for package `my-kernels`) unless
//! [`PtxBuilder::output_name`] says otherwise; the host crate embeds it with
//! `mscclpp::include_ptx!("my_kernels")`. Cargo is told to rebuild when the kernel crate, any
//! source file the nvptx build read (path dependencies included, from its dep-info), or any
//! extra [`PtxBuilder::watch`] path changes.
//!
//! The child build is `--locked` when the kernel crate's workspace already has a `Cargo.lock`
//! (so CI's lock file is honoured); a kernel crate that is its own workspace gets one created.
//!
//! Before building it checks that the toolchain has the components the nvptx build needs
//! (`rust-src`, `llvm-tools`, `llvm-bitcode-linker`); a missing one is one line naming it and
//! the command that installs it. A kernel crate that does not compile is one line naming the
//! crate and the usual fixes; rustc's own messages are in the build script's output.

// The crate example is a build script, whose `fn main` is the point.
#![allow(clippy::needless_doctest_main)]

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
                write!(
                    f,
                    "mscclpp-build must run inside a build.rs ({var} is not set)"
                )
            }
            Self::BadArch(a) => write!(
                f,
                "GPU architecture {a:?} is not of the form sm_XX (set {ARCH_ENV}=sm_90, for example)"
            ),
            Self::Sysroot(e) => write!(f, "could not ask rustc for its sysroot: {e}"),
            Self::MissingComponent { component } => write!(
                f,
                "the Rust component `{component}` is missing (needed for the nvptx64 PTX build): run `rustup toolchain install` next to a rust-toolchain.toml that lists it (as mscclpp-rs's does), or `rustup component add {component}`"
            ),
            Self::NoKernelCrate(p) => {
                write!(f, "no kernel crate at {} (Cargo.toml missing)", p.display())
            }
            Self::Spawn(e) => write!(f, "could not start cargo for the PTX build: {e}"),
            Self::Compile { crate_dir, status } => write!(
                f,
                "the kernel crate {} failed to compile for nvptx64-nvidia-cuda ({status}): fix the errors rustc printed (below, under `--- stderr`); a kernel crate is `#![no_std]`, uses only no_std dependencies, and starts with `#![cfg_attr(target_arch = \"nvptx64\", feature(abi_ptx))]`",
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

    /// Name of the output file `OUT_DIR/<name>.ptx` (default: the crate's library name, with
    /// `_` for `-`); `mscclpp::include_ptx!("<name>")` embeds it.
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
        let crate_dir = std::fs::canonicalize(&crate_dir).unwrap_or(crate_dir);
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
        let sysroot = check_components(Path::new(&rustc))?;

        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target_dir = out_dir.join("ptx-target");
        let mut cmd = Command::new(&cargo);
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
            .args(["rustc", "--lib", "--crate-type", "cdylib", "--release"]);
        if has_lock_file(Path::new(&cargo), &manifest) {
            cmd.arg("--locked");
        }
        cmd.args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
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
        let artifact = lib_name(&manifest);
        let release = target_dir.join("nvptx64-nvidia-cuda/release");
        let built = release.join(format!("{artifact}.ptx"));
        if !built.is_file() {
            return Err(BuildError::NoPtx(built));
        }
        watch_dep_info(&release.join(format!("{artifact}.d")), &sysroot);
        let name = self.name.unwrap_or(artifact);
        let dest = out_dir.join(format!("{name}.ptx"));
        std::fs::copy(&built, &dest).map_err(|e| BuildError::Copy(dest.clone(), e))?;
        Ok(dest)
    }
}

/// Whether the workspace of `manifest` already has a `Cargo.lock` (then the child build is
/// `--locked`; otherwise cargo creates one, as it would for `cargo build` there).
fn has_lock_file(cargo: &Path, manifest: &Path) -> bool {
    Command::new(cargo)
        .args(["locate-project", "--workspace", "--message-format", "plain"])
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let root = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            root.parent().map(|d| d.join("Cargo.lock").is_file())
        })
        .unwrap_or(false)
}

/// Tells cargo to rerun the build when any source file the nvptx build read changes: the
/// paths of cargo's dep-info file for the PTX (the kernel crate and its path dependencies;
/// the toolchain's own sources under `sysroot` are left out). A missing file is not an error:
/// the kernel crate's directory is watched anyway.
fn watch_dep_info(dep_info: &Path, sysroot: &Path) {
    let Ok(text) = std::fs::read_to_string(dep_info) else {
        return;
    };
    for path in dep_info_paths(&text) {
        if !path.starts_with(sysroot) {
            println!("cargo::rerun-if-changed={}", path.display());
        }
    }
}

/// The prerequisites of a Makefile-style dep-info file (`target: dep dep\ with\ space …`).
fn dep_info_paths(text: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut cur = String::new();
        let mut chars = deps.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ' ' => {
                    if !cur.is_empty() {
                        paths.push(PathBuf::from(std::mem::take(&mut cur)));
                    }
                }
                c => cur.push(c),
            }
        }
        if !cur.is_empty() {
            paths.push(PathBuf::from(cur));
        }
    }
    paths
}

fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_").is_some_and(|n| {
        let digits = n.strip_suffix('a').unwrap_or(n);
        digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

/// The library name of a kernel crate: `[lib] name`, else the package name with `-` turned into
/// `_` (what rustc names its artifacts: `my-kernels` → `my_kernels`).
fn lib_name(manifest: &Path) -> String {
    let text = std::fs::read_to_string(manifest).unwrap_or_default();
    let (mut section, mut package, mut lib) = (String::new(), None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
        } else if let Some(v) = line.strip_prefix("name")
            && let Some(v) = v.trim_start().strip_prefix('=')
        {
            let v = v.trim().trim_matches('"').to_string();
            match section.as_str() {
                "[package]" => package = Some(v),
                "[lib]" => lib = Some(v),
                _ => {}
            }
        }
    }
    lib.or(package)
        .unwrap_or_else(|| "kernels".to_string())
        .replace('-', "_")
}

/// Checks the nvptx build's components; returns the toolchain's sysroot.
fn check_components(rustc: &Path) -> Result<PathBuf, BuildError> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| BuildError::Sysroot(e.to_string()))?;
    if !out.status.success() {
        return Err(BuildError::Sysroot(
            String::from_utf8_lossy(&out.stderr).into(),
        ));
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
    Ok(sysroot)
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
        assert!(
            s.contains("`rust-src`") && s.contains("rustup toolchain install"),
            "{s}"
        );
        assert_eq!(s.lines().count(), 1);
    }

    #[test]
    fn dep_info_paths_unescape_spaces() {
        let d = "/t/a.ptx: /src/lib.rs /my\\ dir/x.rs\n\n/src/lib.rs:\n";
        assert_eq!(
            dep_info_paths(d),
            [PathBuf::from("/src/lib.rs"), PathBuf::from("/my dir/x.rs")]
        );
    }

    #[test]
    fn lib_name_reads_package_name() {
        let dir = std::env::temp_dir().join(format!("mscclpp-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = dir.join("Cargo.toml");
        std::fs::write(
            &m,
            "[workspace]\n[package]\nname = \"my-kernels\"\nversion = \"0.1.0\"\n",
        )
        .unwrap();
        assert_eq!(lib_name(&m), "my_kernels");
        std::fs::write(&m, "[package]\nname = \"a-b\"\n[lib]\nname = \"kern\"\n").unwrap();
        assert_eq!(lib_name(&m), "kern");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
